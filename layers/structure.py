r"""Scores and probabilities of given structures.

For a nested structure ``s`` on ``x`` (a set of pairs ``(i, j)``, ``i < j``)::

    score(s) = SUM_{(i,j) in s} [ pair[x_i,x_j] + phi[i][j]
                                  + ( stack[x_i,x_j,x_{j-1},x_{i+1}]  if (i+1, j-1) in s
                                      else loop ) ]
             + SUM_{i unpaired} unpaired[x_i]

    log p(s | x) = score(s) - log Z(x)

which is exactly the grammar of ``chart.py``: ``log_partition`` is the log-sum-exp
of this score over all nested structures with ``j - i > min_hairpin``.

Both functions are plain gathers and sums (O(L) per sequence), work under
``jit``/``grad``/``vmap`` and are differentiable in ``params`` and ``phi``.

Invalid structures. When the pair table and lengths are concrete (the usual
case, also inside ``jax.grad`` w.r.t. params), a table that is not a valid nested
structure of its sequence raises :class:`foldax.layers.dotbracket.StructureError` (a
``ValueError``) naming the sequence and position. Under ``jit`` with a traced
table no error can be raised: the result is ``-inf`` instead (the log of the
probability 0 the model gives it), with finite, all-zero gradients.

Compiler note (issue 10). An earlier version read the neighbours ``pt[i + 1]`` and
``x[i + 1]`` as shifted copies (``pt[:, 1:]``). XLA:CPU fuses such a copy with the
gathers through ``pt`` into one loop, and with AVX2 code generation LLVM's loop
vectorizer miscompiles that loop (the 8 lanes of ``pt[i + 1]`` become one element
broadcast). Forward-only calls with one row per device -- every ``[n]`` call,
``foldax fold`` of a single sequence, an evaluation with one row per device --
without ``phi`` returned wrong scores for most lengths >= 33, while
``value_and_grad`` (training) compiled right. Seen with jaxlib 0.11.1 - 0.12.0.1 on
Intel CPUs with AVX2 code generation (``XLA_FLAGS=--xla_cpu_max_isa=AVX2``; an AMD EPYC
with AVX2 only compiled the plain-JAX repro right); jaxlib 0.7.0 - 0.11.0 and AVX-512
code generation were right (GPUs compile differently: not checked). Every lookup here is now a gather at a data-dependent
index (see :func:`_batched_score`), and ``tests/test_compiled_reference.py`` checks
the compiled functions against float64 references under AVX2 code generation.
Should a jaxlib miscompile some other program this way,
``XLA_FLAGS=--xla_backend_optimization_level=1`` (LLVM at ``-O1``) avoided this
bug, at some cost in speed; ``tests/test_xla_regression.py`` keeps a plain-JAX
reproduction (a strict ``xfail`` while jaxlib has the bug).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers.alphabet import NUM_TOKENS
from foldax.layers.chart import DEFAULT_NUM_CHUNKS
from foldax.layers.dotbracket import StructureError, lonely_pairs, validate_pair_table
from foldax.layers.inside import (
    _batched_value,
    _check_inputs,
    _is_concrete,
    _result_dtype,
    batch_sharded,
    check_no_lonely_pairs,
    check_params,
    is_energy_params,
    pair_phi,
)


def _check_pair_table(pair_table, tokens_shape, lengths, min_hairpin, batched):
    """Shape/dtype checks always; full validity (nested, symmetric, hairpins) if concrete."""
    pair_table = jnp.asarray(pair_table) if not isinstance(pair_table, jax.Array) else pair_table
    expected = tokens_shape if batched else tokens_shape[1:]
    if pair_table.shape != tuple(expected):
        raise ValueError(f"pair_table must have the shape of tokens {tuple(expected)}, got {pair_table.shape}")
    if not jnp.issubdtype(pair_table.dtype, jnp.integer):
        raise TypeError(f"pair_table must hold integers (partner index or -1), got dtype {pair_table.dtype}")
    if not batched:
        pair_table = pair_table[None]
    if _is_concrete(pair_table) and _is_concrete(lengths):
        tables, ns = np.asarray(pair_table), np.asarray(lengths)
        for b, (table, n) in enumerate(zip(tables, ns)):
            try:
                validate_pair_table(table[:n], min_hairpin=min_hairpin, nested=True)
            except StructureError as e:
                where = f"sequence {b} (length {n}): " if batched else ""
                raise StructureError(f"invalid pair table: {where}{e}", position=e.position, reason=e.reason) from e
    return pair_table.astype(jnp.int32)


def _validity(pt, lengths, min_hairpin):
    """[B] bool: each (already length-masked) table is a valid nested structure.

    Nesting in O(L): with ``c[k]`` the number of opening minus closing positions
    up to and including ``k``, a symmetric table is nested iff
    ``c[i] - 1 == c[j]`` for every pair ``(i, j)``, ``i < j`` (the depth just
    before ``i`` equals the depth just after ``j``). (Within a pair's span,
    pairs leaving to the right count +1 and to the left -1; the crossing pair
    with the smallest opening position is crossed only from the right, so some
    pair has a nonzero count whenever two pairs cross.) Every lookup is a
    gather at a data-dependent index, none a shifted copy (see :func:`_batched_score`).
    """
    _, length = pt.shape
    idx = jnp.arange(length)
    active = idx < lengths[:, None]
    partner = jnp.clip(pt, 0, max(length - 1, 0))
    paired = pt != -1
    in_range = (pt >= -1) & (pt < lengths[:, None])
    symmetric = jnp.take_along_axis(pt, partner, axis=1) == idx
    long_enough = jnp.abs(pt - idx) > min_hairpin
    opens = paired & (pt > idx)
    closes = paired & (pt < idx)
    depth = jnp.cumsum(opens.astype(jnp.int32) - closes, axis=1)  # inclusive: after position k
    nested = ~opens | (depth - 1 == jnp.take_along_axis(depth, partner, axis=1))
    ok = in_range & (~paired | (symmetric & long_enough & nested))
    return jnp.all(ok | ~active, axis=1)


def _without_lonely_pairs(pt, lengths):
    """[B] bool: every pair (i, j) of each table stacks on (i + 1, j - 1) or (i - 1, j + 1)."""
    length = pt.shape[1]
    idx = jnp.arange(length)
    pt = jnp.where(idx < lengths[:, None], pt, -1)
    padded = jnp.pad(pt, ((0, 0), (1, 1)), constant_values=-1)  # position k at k + 1
    stacked = (padded[:, 2:] == pt - 1) | (padded[:, :-2] == pt + 1)
    return jnp.all((pt <= idx) | stacked, axis=1)


def _check_no_lonely_pairs(pair_table, lengths, batched):
    """Raises StructureError naming the first lonely pair of a concrete table."""
    if not (_is_concrete(pair_table) and _is_concrete(lengths)):
        return
    for b, (table, n) in enumerate(zip(np.asarray(pair_table), np.asarray(lengths))):
        lonely = lonely_pairs(table[:n])
        if lonely:
            i, j = lonely[0]
            where = f"sequence {b} (length {n}): " if batched else ""
            raise StructureError(f"{where}pair ({i}, {j}) is a lonely pair (no stacked neighbour), which "
                                 f"no_lonely_pairs=True excludes ({len(lonely)} such pair(s))",
                                 position=i, reason="lonely_pair")


def _flat_lookup(table, indices):
    """``table[i0, i1, ...]`` as one gather from the flattened table (indices in range)."""
    flat = indices[0]
    for size, index in zip(table.shape[1:], indices[1:]):
        flat = flat * size + index
    return jnp.take(table.reshape(-1), flat, mode="clip")


@functools.partial(jax.jit, static_argnames=("min_hairpin",))
def _batched_score(params, tokens, pair_table, lengths, phi, *, min_hairpin):
    """(score [B], valid [B]) for batched inputs; score is finite even when invalid.

    Every lookup is a gather at a data-dependent index (the partner ``j = pt[i]``,
    ``j - 1`` and its partner), never a copy shifted by one position (``pt[i + 1]``,
    ``x[i + 1]``): XLA:CPU fuses such a shifted copy with the gathers into one loop,
    and on AVX2 code generation (jaxlib 0.11.1 - 0.12.0.1 at least) LLVM's loop
    vectorizer miscompiles that loop -- it loads one element of ``pt[i + 1]`` for
    all 8 lanes -- so the stacked-pair terms came out wrong for lengths >= 33
    (see the module docstring and ``tests/test_xla_regression.py``). The pair
    ``(i, j)`` stacks on ``(i + 1, j - 1)`` iff ``pt[j - 1] == i + 1``, and then
    ``x_{i+1} = x[pt[j - 1]]``: the same quantities, from gathers only.
    """
    dtype = _result_dtype(params)
    _, length = tokens.shape
    idx = jnp.arange(length)
    active = idx < lengths[:, None]
    pt = jnp.where(active, pair_table, -1)  # entries past the length are ignored
    valid = _validity(pt, lengths, min_hairpin)

    x = jnp.clip(tokens, 0, NUM_TOKENS - 1)
    last = max(length - 1, 0)
    j = jnp.clip(pt, 0, last)  # clipped gathers keep invalid tables finite
    jm1 = jnp.maximum(j - 1, 0)
    inner = jnp.take_along_axis(pt, jm1, axis=1)  # partner of j - 1
    opens = pt > idx
    stacked = opens & (inner == idx + 1) & (jm1 > idx + 1)
    x_j = jnp.take_along_axis(x, j, axis=1)
    x_jm1 = jnp.take_along_axis(x, jm1, axis=1)
    x_ip1 = jnp.take_along_axis(x, jnp.clip(inner, 0, last), axis=1)  # = x_{i+1} where stacked

    p = {k: params[k].astype(dtype) for k in ("stack", "pair", "unpaired", "loop")}
    pair_term = _flat_lookup(p["pair"], (x, x_j))
    inner_term = jnp.where(stacked, _flat_lookup(p["stack"], (x, x_j, x_jm1, x_ip1)), p["loop"])
    score = jnp.sum(jnp.where(opens, pair_term + inner_term, 0), axis=1)
    score = score + jnp.sum(jnp.where((pt == -1) & active, _flat_lookup(p["unpaired"], (x,)), 0), axis=1)
    if phi is not None:
        score = score + pair_phi(phi.astype(dtype), pt)
    return score, valid


def _prepare(params, tokens, pair_table, lengths, phi, min_hairpin):
    params = check_params(params)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    pair_table = _check_pair_table(pair_table, tokens.shape, lengths, int(min_hairpin), batched)
    if is_energy_params(params) and all(_is_concrete(a) for a in (tokens, pair_table, lengths)):
        from foldax.layers.free_energy import check_turner_tables

        # On host copies: the check's gathers cannot take a batch sharded over an explicit mesh.
        check_turner_tables(params, *(np.asarray(a) for a in (tokens, pair_table, lengths)), int(min_hairpin))
    return params, tokens, pair_table, lengths, phi, batched


@functools.partial(jax.jit, static_argnames=("min_hairpin",))
def _batched_turner_score(params, tokens, pair_table, lengths, phi, *, min_hairpin):
    from foldax.layers.free_energy import turner_structure_score

    return turner_structure_score(params, tokens, pair_table, lengths, phi, min_hairpin)


def _score(params, tokens, pair_table, lengths, phi, min_hairpin):
    scorer = _batched_turner_score if is_energy_params(params) else _batched_score
    run = functools.partial(scorer, min_hairpin=int(min_hairpin))
    return batch_sharded(run, tokens, num_outputs=2)(params, tokens, pair_table, lengths, phi)


def structure_score(params, tokens, pair_table, lengths=None, *, phi=None, min_hairpin=3):
    """``score(s)`` of the structure(s) ``pair_table`` (see the module docstring).

    Args:
      params, tokens, lengths, phi, min_hairpin: as for :func:`foldax.layers.log_partition`.
      pair_table: int ``[n]`` or ``[B, L]``: partner index or -1 (see ``foldax.layers.dotbracket``);
        entries at positions ``>= lengths[b]`` are ignored (pad with -1).

    Returns:
      a scalar (or ``[B]``) in the params' dtype; ``-inf`` for an invalid table under
      ``jit`` (outside it, an invalid concrete table raises ``StructureError``).

    Example:
      >>> from foldax import layers
      >>> from foldax.layers.dotbracket import from_dot_bracket
      >>> params = layers.default_params()
      >>> s = structure_score(params, layers.encode("GGGAAACCC"), from_dot_bracket("(((...)))"))
      >>> float(s)  # 3 pairs at -1, two stacks (GC on GC: 3.0) and one loop closure (-3)
      0.0
    """
    params, tokens, pair_table, lengths, phi, batched = _prepare(params, tokens, pair_table, lengths, phi, min_hairpin)
    score, valid = _score(params, tokens, pair_table, lengths, phi, min_hairpin)
    out = jnp.where(valid, score, -jnp.inf)
    return out if batched else out[0]


def log_prob(params, tokens, pair_table, lengths=None, *, phi=None, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS,
             no_lonely_pairs=False):
    """``log p(s | x) = score(s) - log Z(x)``; same arguments as :func:`structure_score`.

    ``-inf`` (with zero gradients) for an invalid table under ``jit``. With
    ``no_lonely_pairs=True`` (Turner parameters) ``Z`` sums over the structures without
    lonely pairs (see :func:`foldax.layers.log_partition`), and a table with one is invalid.

    Example:
      >>> from foldax import layers
      >>> from foldax.layers.dotbracket import from_dot_bracket
      >>> lp = log_prob(layers.default_params(), layers.encode("GGGAAACCC"), from_dot_bracket("(((...)))"))
      >>> 0.0 < float(jnp.exp(lp)) < 1.0
      True
    """
    params, tokens, pair_table, lengths, phi, batched = _prepare(params, tokens, pair_table, lengths, phi, min_hairpin)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    score, valid = _score(params, tokens, pair_table, lengths, phi, min_hairpin)
    if no_lonely_pairs:
        _check_no_lonely_pairs(pair_table, lengths, batched)
        valid = valid & _without_lonely_pairs(pair_table, lengths)
    run = functools.partial(_batched_value, min_hairpin=int(min_hairpin), semiring="log", num_chunks=num_chunks,
                            no_lonely_pairs=no_lonely_pairs)
    log_z = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    # Select after subtracting, so an invalid table sends no gradient into log Z either.
    out = jnp.where(valid, score - log_z, -jnp.inf)
    return out if batched else out[0]
