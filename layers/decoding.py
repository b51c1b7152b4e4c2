r"""Decoding: base-pair probabilities, best / MEA structures and exact samples.

Everything here reuses the chart engine (``chart.py``); nothing has its own O(n^3) loop.

* :func:`pair_probs` -- ``P[i, j] = p((i, j) in s | x)``. Since ``phi[i][j]`` enters the
  score of exactly the structures containing (i, j), ``P = d log Z / d phi``
  (the outside algorithm, via ``jax.grad``).
* :func:`best_structure` -- ``argmax_s score(s)``: in the max semiring the gradient of
  ``max_score`` w.r.t. ``phi`` is the 0/1 indicator of the best structure's pairs.
* :func:`mea_structure` -- maximum expected accuracy: maximise
  ``SUM_{(i,j) in s} 2 gamma P[i,j] + SUM_{i unpaired} q_i`` with ``q_i = 1 - SUM_j P[i,j]``.
  Subtracting the constant ``SUM_i q_i`` gives ``SUM_{(i,j) in s} (2 gamma P[i,j] - q_i - q_j)``,
  i.e. :func:`best_structure` with zero params and ``phi = 2 gamma P - q_i - q_j``.
* :func:`sample_structures` -- exact samples from ``p(s | x) = e^{score(s)} / Z`` by a
  stochastic traceback through the inside charts.

All functions are jit-compiled, take ``[n]`` or padded ``[B, L]`` inputs with
``lengths`` like :func:`layers.log_partition`, and return pair tables (int32,
partner or -1, -1 on padding) or ``[.., L, L]`` matrices (0 on padding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from layers.chart import DEFAULT_NUM_CHUNKS
from layers.inside import (
    _batched_value,
    _check_inputs,
    _result_dtype,
    batch_sharded,
    cell_scores,
    check_params,
    inside_charts,
)


def _phi_gradient(params, tokens, lengths, phi, min_hairpin, semiring, num_chunks):
    """d value / d phi [B, L, L] (upper triangle; phi = 0 when None)."""
    if phi is None:
        phi = jnp.zeros(tokens.shape + tokens.shape[-1:], _result_dtype(params))
    value = functools.partial(
        _batched_value, params, tokens, lengths, min_hairpin=min_hairpin, semiring=semiring, num_chunks=num_chunks
    )
    return jax.grad(lambda f: jnp.sum(value(f)))(phi)


def _valid_square(lengths, length):
    idx = jnp.arange(length)
    valid = idx[None, :] < lengths[:, None]
    return valid[:, :, None] & valid[:, None, :]


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks"))
def _pair_probs(params, tokens, lengths, phi, *, min_hairpin, num_chunks):
    grad = _phi_gradient(params, tokens, lengths, phi, min_hairpin, "log", num_chunks)
    probs = grad + jnp.swapaxes(grad, 1, 2)
    return jnp.where(_valid_square(lengths, tokens.shape[1]), probs, 0)


def pair_probs(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS):
    """Base-pair probabilities ``P[i, j] = SUM_{s containing (i,j)} p(s | x)``.

    Arguments as for :func:`layers.log_partition`. Returns ``[n, n]`` (or ``[B, L, L]``):
    symmetric, zero on the diagonal, below ``min_hairpin`` and on padding; each row sums
    to ``p(i paired) <= 1``. Cost: one inside and one outside pass.

    Example:
      >>> import layers
      >>> P = pair_probs(layers.default_params(), layers.encode("GGGGAAACCCC"))
      >>> round(float(P[0, 10]), 2), bool(P.sum(axis=1).max() <= 1 + 1e-6)
      (0.61, True)
    """
    params = check_params(params)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(_pair_probs, min_hairpin=int(min_hairpin), num_chunks=num_chunks)
    out = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    return out if batched else out[0]


def _table_from_indicator(indicator, lengths):
    """Symmetric 0/1 pair matrix [B, L, L] -> pair table [B, L] (-1 unpaired or padding)."""
    length = indicator.shape[1]
    if length == 0:
        return jnp.zeros(indicator.shape[:2], jnp.int32)
    paired = jnp.max(indicator, axis=2) > 0.5
    paired &= jnp.arange(length)[None, :] < lengths[:, None]
    return jnp.where(paired, jnp.argmax(indicator, axis=2), -1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks"))
def _best_structure(params, tokens, lengths, phi, *, min_hairpin, num_chunks):
    grad = _phi_gradient(params, tokens, lengths, phi, min_hairpin, "max", num_chunks)
    return _table_from_indicator(grad + jnp.swapaxes(grad, 1, 2), lengths)


def best_structure(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS):
    """The highest-scoring structure ``argmax_s score(s)`` as a pair table.

    Arguments as for :func:`layers.max_score`; its :func:`layers.structure_score` equals
    ``max_score``. Ties are broken deterministically by the max semiring (the first
    alternative of each arg-max: a base left unpaired before a pair, the smallest split
    point, stacking before a loop). Returns int32 ``[n]`` (or ``[B, L]``, -1 on padding).

    Example:
      >>> import layers
      >>> pt = best_structure(layers.default_params(), layers.encode("GGGGAAACCCC"))
      >>> layers.to_dot_bracket(pt)
      '((((...))))'
    """
    params = check_params(params)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(_best_structure, min_hairpin=int(min_hairpin), num_chunks=num_chunks)
    out = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    return out if batched else out[0]


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks"))
def _mea_structure(probs, lengths, gamma, *, min_hairpin, num_chunks):
    probs = jnp.where(_valid_square(lengths, probs.shape[1]), probs, 0)
    q = 1 - jnp.sum(probs, axis=2)
    phi = 2 * gamma * probs - q[:, :, None] - q[:, None, :]
    zero = jnp.zeros((), probs.dtype)
    params = {"stack": jnp.zeros((5,) * 4, probs.dtype), "pair": jnp.zeros((5, 5), probs.dtype),
              "unpaired": jnp.zeros((5,), probs.dtype), "loop": zero}
    tokens = jnp.zeros(probs.shape[:2], jnp.int32)
    return _best_structure(params, tokens, lengths, phi, min_hairpin=min_hairpin, num_chunks=num_chunks)


def mea_structure(pair_probs, lengths=None, *, gamma=1.0, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS):
    """Maximum expected accuracy structure for base-pair probabilities ``pair_probs``.

    Maximises ``SUM_{(i,j) in s} 2 gamma P[i,j] + SUM_{i unpaired} (1 - SUM_j P[i,j])`` over
    nested structures with ``j - i > min_hairpin`` (larger ``gamma``: more pairs). Runs the
    chart engine in the max semiring (JAX, jit-compiled, batched; one O(n^3) inside and
    outside pass). Ties are broken as in :func:`best_structure`.

    Args:
      pair_probs: ``[n, n]`` or ``[B, L, L]`` symmetric probabilities (see :func:`pair_probs`).
      lengths: int ``[B]`` (batched only); entries beyond a length are ignored.
      gamma: pair weight (a float; may be traced).

    Example:
      >>> import layers
      >>> params, x = layers.default_params(), layers.encode("GGGGAAACCCC")
      >>> layers.to_dot_bracket(mea_structure(pair_probs(params, x)))
      '((((...))))'
    """
    probs = jnp.asarray(pair_probs)
    if not jnp.issubdtype(probs.dtype, jnp.floating):
        probs = probs.astype(jnp.float32)
    if probs.ndim not in (2, 3) or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(f"pair_probs must have shape [n, n] or [B, L, L], got {probs.shape}")
    tokens = jnp.zeros(probs.shape[:-1], jnp.int32)
    _, lengths, _, batched = _check_inputs(tokens, lengths, None, min_hairpin)
    probs = probs if batched else probs[None]
    gamma = jnp.asarray(gamma, probs.dtype)
    run = functools.partial(_mea_structure, min_hairpin=int(min_hairpin), num_chunks=num_chunks)
    out = batch_sharded(run, probs)(probs, lengths, gamma)
    return out if batched else out[0]


# --------------------------------------------------------------------------- #
# sampling
# --------------------------------------------------------------------------- #

_Z, _ZN, _P, _DONE = 0, 1, 2, 3  # traceback states: which chart cell is being expanded


def _choose(logits, u):
    """Index k with probability softmax(logits)[k], by inverting the CDF at u in [0, 1)."""
    w = jnp.exp(logits - jnp.max(logits))
    cdf = jnp.cumsum(w)
    k = jnp.sum(cdf <= u * cdf[-1])
    # Rounding can put u * total at the very end: never pick a zero-weight tail entry.
    last = w.shape[0] - 1 - jnp.argmax(w[::-1] > 0)
    return jnp.minimum(k, last).astype(jnp.int32)


def _traceback(charts, stack_w, loop, n, key, min_hairpin):
    """One exact sample for one sequence of length n from its log-semiring charts.

    Cells are expanded top-down with the same recursions the inside pass summed:

    * ``Z[i][j] = SUM_{k=i}^{j} F[i][k] + Z[k+1][j]`` (k = i: i unpaired; k > i: pair (i, k),
      with ``F[i][k] = P[i][k]``; ``Zn`` is the same sum without k = j for j > i);
    * ``P[i][j]``: stacked on ``P[i+1][j-1]`` or a loop over ``Zn[i+1][j-1]``.

    Each alternative is drawn with probability ``e^{term - cell}``. Pending right parts
    ``Z[k+1][j]`` of splits wait on an explicit stack. Each iteration consumes a base or
    pops a span, so the loop runs at most about 2n times.
    """
    F, Zn, Zr = charts
    length = F.shape[1] - 1
    ks = jnp.arange(length)
    neg_inf = jnp.array(-jnp.inf, F.dtype)

    def split_logits(i, j, kmax):
        left = F[jnp.clip(ks - i, 0, length), i]  # F[i][k] (row 0: unpaired x_i)
        right = Zr[jnp.clip(length - (j - ks - 1), 0, Zr.shape[0] - 1), j]  # Z[k+1][j]; row L+1 = empty
        return jnp.where((ks >= i) & (ks <= kmax), left + right, neg_inf)

    def body(carry):
        kind, i, j, stack, top, table, step = carry
        u = jax.random.uniform(jax.random.fold_in(key, step), dtype=F.dtype)
        # A non-empty Z / Zn span: leave i unpaired or pair it with some k.
        kmax = jnp.where(kind == _Z, j, jnp.maximum(j - 1, i))
        k = _choose(split_logits(i, j, kmax), u)
        pairs_k = k > i
        push = (kind < _P) & (i <= j) & pairs_k & (k < j)
        stack = stack.at[top].set(jnp.where(push, jnp.stack([k + 1, j]).astype(jnp.int32), stack[top]))
        span_next = (jnp.where(pairs_k, _P, _Z), jnp.where(pairs_k, i, i + 1), jnp.where(pairs_k, k, j))
        # An empty span: resume the most recent pending one, or finish.
        pop_next = (jnp.where(top > 0, _Z, _DONE), stack[top - 1, 0], stack[top - 1, 1])
        # A pair (i, j): record it, then stack onto (i+1, j-1) or open a loop there.
        d = j - i
        stacked = jnp.where(d - 2 > min_hairpin, stack_w[d, i] + F[jnp.maximum(d - 2, 0), i + 1], neg_inf)
        looped = loop + Zn[jnp.maximum(d - 1, 0), i + 1]
        take_stack = u < jnp.exp(stacked - jnp.logaddexp(stacked, looped))
        pair_next = (jnp.where(take_stack, _P, _ZN), i + 1, j - 1)
        is_pair = kind == _P
        table = jnp.where(is_pair, table.at[i].set(j).at[j].set(i), table)

        is_empty = (kind < _P) & (i > j)
        choose = lambda a, b, c: jnp.where(is_pair, c, jnp.where(is_empty, b, a))
        kind, i, j = (choose(*options).astype(jnp.int32) for options in zip(span_next, pop_next, pair_next))
        top = (top + push - (is_empty & (top > 0))).astype(jnp.int32)
        return kind, i, j, stack, top, table, step + 1

    stack = jnp.zeros((length + 1, 2), jnp.int32)
    table = jnp.full((length,), -1, jnp.int32)
    start = (jnp.where(n > 0, _Z, _DONE).astype(jnp.int32), jnp.int32(0), (n - 1).astype(jnp.int32), stack,
             jnp.int32(0), table, jnp.int32(0))
    return lax.while_loop(lambda c: c[0] != _DONE, body, start)[5]


@functools.partial(jax.jit, static_argnames=("num_samples", "min_hairpin", "num_chunks"))
def _sample(key, params, tokens, lengths, phi, *, num_samples, min_hairpin, num_chunks):
    charts = inside_charts(params, tokens, phi=phi, min_hairpin=min_hairpin, semiring="log", num_chunks=num_chunks)
    _, stack_w, _, loop = cell_scores(params, tokens, phi)
    keys = jax.vmap(lambda b: jax.random.split(jax.random.fold_in(key, b), num_samples))(jnp.arange(tokens.shape[0]))
    per_sample = jax.vmap(_traceback, in_axes=(None, None, None, None, 0, None))
    per_sequence = jax.vmap(per_sample, in_axes=(0, 0, None, 0, 0, None))
    return per_sequence(charts, stack_w, loop, lengths, keys, min_hairpin)


def sample_structures(key, params, tokens, num_samples, lengths=None, *, phi=None, min_hairpin=3,
                      num_chunks=DEFAULT_NUM_CHUNKS):
    """``num_samples`` exact, independent samples from ``p(s | x) = e^{score(s)} / Z(x)``.

    One inside pass (``layers.inside.inside_charts``), then a stochastic traceback per
    sample (vectorised over samples and sequences; O(n L) work per sample).

    Args:
      key: a JAX PRNG key.
      num_samples: static int.
      params, tokens, lengths, phi, min_hairpin: as for :func:`layers.log_partition`.

    Returns:
      int32 pair tables ``[num_samples, n]`` (or ``[B, num_samples, L]``, -1 on padding).

    Example:
      >>> import jax, layers
      >>> tables = sample_structures(jax.random.key(0), layers.default_params(), layers.encode("GGGGAAACCCC"), 1000)
      >>> tables.shape, round(float((tables[:, 0] == 10).mean()), 1)  # pair_probs: P[0, 10] = 0.61
      ((1000, 11), 0.6)
    """
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ValueError(f"num_samples must be a non-negative int (static), got {num_samples!r}")
    params = check_params(params)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    if tokens.shape[1] == 0:
        return jnp.zeros((tokens.shape[0], num_samples, 0) if batched else (num_samples, 0), jnp.int32)
    run = functools.partial(_sample, num_samples=int(num_samples), min_hairpin=int(min_hairpin), num_chunks=num_chunks)
    out = batch_sharded(run, tokens)(key, params, tokens, lengths, phi)
    return out if batched else out[0]
