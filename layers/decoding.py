r"""Decoding: base-pair probabilities, best / MEA structures and exact samples.

Everything here reuses the chart engine (``chart.py``); nothing has its own O(n^3) loop.

* :func:`pair_probs` -- ``P[i, j] = p((i, j) in s | x)``. Since ``phi[i][j]`` enters the
  score of exactly the structures containing (i, j), ``P = d log Z / d phi``
  (the outside algorithm, via ``jax.grad``).
* :func:`mixture_pair_probs` -- ``SUM_k w_k P_k``, the pair probabilities of a mixture of models.
* :func:`best_structure` -- ``argmax_s score(s)``: the max semiring's charts, then a traceback
  that expands each chosen cell with the pullback of its own recursion
  (``layers/traceback.py``). With ``method="outside"``, the full outside pass: in the max
  semiring the gradient of ``max_score`` w.r.t. ``phi`` is the 0/1 indicator of the best
  structure's pairs.
* :func:`mea_structure` -- maximum expected accuracy: maximise
  ``SUM_{(i,j) in s} 2 gamma P[i,j] + SUM_{i unpaired} q_i`` with ``q_i = 1 - SUM_j P[i,j]``.
  Subtracting the constant ``SUM_i q_i`` gives ``SUM_{(i,j) in s} (2 gamma P[i,j] - q_i - q_j)``,
  i.e. :func:`best_structure` with zero params and ``phi = 2 gamma P - q_i - q_j``.
* :func:`sample_structures` -- exact samples from ``p(s | x) = e^{score(s)} / Z`` by a
  stochastic traceback through the inside charts (the same traceback in the sampling semiring).

All functions are jit-compiled, take ``[n]`` or padded ``[B, L]`` inputs with
``lengths`` like :func:`foldax.layers.log_partition`, and return pair tables (int32,
partner or -1, -1 on padding) or ``[.., L, L]`` matrices (0 on padding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers import chart, traceback
from foldax.layers.chart import DEFAULT_NUM_CHUNKS
from foldax.layers.inside import (
    _batched_value,
    _check_inputs,
    _result_dtype,
    batch_sharded,
    check_no_lonely_pairs,
    check_params,
    engine_inputs,
)


def _phi_gradient(params, tokens, lengths, phi, min_hairpin, semiring, num_chunks, no_lonely_pairs=False):
    """(value [B], d value / d phi [B, L, L]) (upper triangle; phi = 0 when None)."""
    if phi is None:
        phi = jnp.zeros(tokens.shape + tokens.shape[-1:], _result_dtype(params))
    value = functools.partial(
        _batched_value, params, tokens, lengths, min_hairpin=min_hairpin, semiring=semiring, num_chunks=num_chunks,
        no_lonely_pairs=no_lonely_pairs,
    )

    def total(f):
        values = value(f)
        return jnp.sum(values), values

    (_, values), grad = jax.value_and_grad(total, has_aux=True)(phi)
    return values, grad


def _valid_square(lengths, length):
    idx = jnp.arange(length)
    valid = idx[None, :] < lengths[:, None]
    return valid[:, :, None] & valid[:, None, :]


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks", "no_lonely_pairs"))
def _pair_probs(params, tokens, lengths, phi, *, min_hairpin, num_chunks, no_lonely_pairs=False):
    _, grad = _phi_gradient(params, tokens, lengths, phi, min_hairpin, "log", num_chunks, no_lonely_pairs)
    probs = grad + jnp.swapaxes(grad, 1, 2)
    return jnp.where(_valid_square(lengths, tokens.shape[1]), probs, 0)


def pair_probs(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS,
               no_lonely_pairs=False):
    """Base-pair probabilities ``P[i, j] = SUM_{s containing (i,j)} p(s | x)``.

    Arguments as for :func:`foldax.layers.log_partition`. Returns ``[n, n]`` (or ``[B, L, L]``):
    symmetric, zero on the diagonal, below ``min_hairpin`` and on padding; each row sums
    to ``p(i paired) <= 1``. Cost: one inside and one outside pass.

    Example:
      >>> from foldax import layers
      >>> P = pair_probs(layers.default_params(), layers.encode("GGGGAAACCCC"))
      >>> round(float(P[0, 10]), 2), bool(P.sum(axis=1).max() <= 1 + 1e-6)
      (0.61, True)
    """
    params = check_params(params)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(_pair_probs, min_hairpin=int(min_hairpin), num_chunks=num_chunks,
                            no_lonely_pairs=no_lonely_pairs)
    out = batch_sharded(run, tokens)(params, tokens, lengths, phi)
    return out if batched else out[0]


def mixture_pair_probs(param_sets, tokens, lengths=None, *, weights=None, phi=None, min_hairpin=3,
                       num_chunks=DEFAULT_NUM_CHUNKS, no_lonely_pairs=False):
    """Base-pair probabilities of a mixture of models: ``P[i, j] = SUM_k w_k P_k[i, j]``.

    ``P_k`` is :func:`pair_probs` under ``param_sets[k]`` (each set of either grammar), ``weights``
    (default uniform; nonnegative, normalised to sum to 1) the mixture's weights. The mixture is
    the ensemble of a model whose parameters are themselves uncertain, ``p(s | x) = SUM_k w_k
    p_k(s | x)``: where energy sets disagree (e.g. Turner 2004 and Turner 1999), decoding the
    mixture's probabilities (:func:`mea_structure`) hedges between them. Other arguments as for
    :func:`pair_probs`; differentiable in every set and in ``weights``.

    Example (a mixture of one set is that set):
      >>> from foldax import layers
      >>> params, x = layers.default_params(), layers.encode("GGGGAAACCCC")
      >>> both = mixture_pair_probs([params, params], x, weights=[0.3, 0.7])
      >>> bool(jnp.allclose(both, pair_probs(params, x), atol=1e-6))
      True
    """
    param_sets = list(param_sets)
    if not param_sets:
        raise ValueError("mixture_pair_probs needs at least one parameter set")
    if weights is None:
        weights = np.full(len(param_sets), 1.0 / len(param_sets))
    weights = jnp.asarray(weights)
    if weights.shape != (len(param_sets),):
        raise ValueError(f"mixture_pair_probs: {len(param_sets)} parameter sets but weights of shape {weights.shape}")
    if not isinstance(weights, jax.core.Tracer):
        w = np.asarray(weights, np.float64)
        if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
            raise ValueError(f"mixture_pair_probs: weights must be finite, nonnegative and not all 0, got {w.tolist()}")
    kwargs = dict(phi=phi, min_hairpin=min_hairpin, num_chunks=num_chunks, no_lonely_pairs=no_lonely_pairs)
    parts = [pair_probs(p, tokens, lengths, **kwargs) for p in param_sets]
    weights = weights.astype(parts[0].dtype) / jnp.sum(weights.astype(parts[0].dtype))
    return sum(weights[k] * part for k, part in enumerate(parts))


def _table_from_indicator(indicator, lengths):
    """Symmetric 0/1 pair matrix [B, L, L] -> pair table [B, L] (-1 unpaired or padding)."""
    length = indicator.shape[1]
    if length == 0:
        return jnp.zeros(indicator.shape[:2], jnp.int32)
    paired = jnp.max(indicator, axis=2) > 0.5
    paired &= jnp.arange(length)[None, :] < lengths[:, None]
    return jnp.where(paired, jnp.argmax(indicator, axis=2), -1).astype(jnp.int32)


#: How :func:`best_structure`, :func:`mea_structure` and :func:`sample_structures` read their
#: structures off the charts: ``"traceback"`` expands only the chosen cells, one cell at a time
#: (``layers/traceback.py``; O(n) cell steps per structure); ``"outside"`` runs the full outside
#: pass of the max or sampling semiring (O(n^3) per structure, but no sequential loop: the
#: form for accelerators, and the traceback's reference in the tests).
METHODS = ("traceback", "outside")


def _check_method(method):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks", "no_lonely_pairs", "method", "with_score"))
def _best_structure(params, tokens, lengths, phi, *, min_hairpin, num_chunks, no_lonely_pairs=False,
                    method="traceback", with_score=False):
    if method == "traceback" and tokens.shape[1] > 0:
        problem, inputs = engine_inputs(params, tokens, lengths, phi, min_hairpin=min_hairpin, semiring="max",
                                        num_chunks=num_chunks, no_lonely_pairs=no_lonely_pairs)
        table, best = traceback.best_tables(problem, inputs, lengths)
        return (table, best) if with_score else table
    best, grad = _phi_gradient(params, tokens, lengths, phi, min_hairpin, "max", num_chunks, no_lonely_pairs)
    table = _table_from_indicator(grad + jnp.swapaxes(grad, 1, 2), lengths)
    return (table, best) if with_score else table


def best_structure(params, tokens, lengths=None, *, phi=None, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS,
                   no_lonely_pairs=False, method="traceback", with_score=False):
    """The highest-scoring structure ``argmax_s score(s)`` as a pair table.

    Arguments as for :func:`foldax.layers.max_score`; its :func:`foldax.layers.structure_score` equals
    ``max_score``. Ties are broken deterministically by the max semiring (the first
    alternative of each arg-max: a base left unpaired before a pair, the smallest split
    point, stacking before a loop). Returns int32 ``[n]`` (or ``[B, L]``, -1 on padding).
    ``method`` (see :data:`METHODS`): ``"traceback"`` (the max charts, then one cell step per
    node of the structure) or ``"outside"`` (the max semiring's outside pass). With
    ``with_score``, returns ``(structure, max_score)`` from the same charts.

    Example:
      >>> from foldax import layers
      >>> pt = best_structure(layers.default_params(), layers.encode("GGGGAAACCCC"))
      >>> layers.to_dot_bracket(pt)
      '((((...))))'
    """
    params = check_params(params)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    run = functools.partial(_best_structure, min_hairpin=int(min_hairpin), num_chunks=num_chunks,
                            no_lonely_pairs=no_lonely_pairs, method=_check_method(method), with_score=bool(with_score))
    out = batch_sharded(run, tokens, num_outputs=2 if with_score else 1)(params, tokens, lengths, phi)
    if with_score:
        return out if batched else jax.tree.map(lambda x: x[0], out)
    return out if batched else out[0]


@functools.partial(jax.jit, static_argnames=("min_hairpin", "num_chunks", "method"))
def _mea_structure(probs, lengths, gamma, *, min_hairpin, num_chunks, method="traceback"):
    probs = jnp.where(_valid_square(lengths, probs.shape[1]), probs, 0)
    q = 1 - jnp.sum(probs, axis=2)
    phi = 2 * gamma * probs - q[:, :, None] - q[:, None, :]
    zero = jnp.zeros((), probs.dtype)
    params = {"stack": jnp.zeros((5,) * 4, probs.dtype), "pair": jnp.zeros((5, 5), probs.dtype),
              "unpaired": jnp.zeros((5,), probs.dtype), "loop": zero}
    tokens = jnp.zeros(probs.shape[:2], jnp.int32)
    return _best_structure(params, tokens, lengths, phi, min_hairpin=min_hairpin, num_chunks=num_chunks,
                           method=method)


def mea_structure(pair_probs, lengths=None, *, gamma=1.0, min_hairpin=3, num_chunks=DEFAULT_NUM_CHUNKS,
                  method="traceback"):
    """Maximum expected accuracy structure for base-pair probabilities ``pair_probs``.

    Maximises ``SUM_{(i,j) in s} 2 gamma P[i,j] + SUM_{i unpaired} (1 - SUM_j P[i,j])`` over
    nested structures with ``j - i > min_hairpin`` (larger ``gamma``: more pairs). Runs the
    chart engine in the max semiring (JAX, jit-compiled, batched; one O(n^3) inside pass and a
    traceback, or with ``method="outside"`` an outside pass). Ties are broken as in
    :func:`best_structure`.

    Args:
      pair_probs: ``[n, n]`` or ``[B, L, L]`` symmetric probabilities (see :func:`pair_probs`).
      lengths: int ``[B]`` (batched only); entries beyond a length are ignored.
      gamma: pair weight (a float; may be traced).

    Example:
      >>> from foldax import layers
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
    run = functools.partial(_mea_structure, min_hairpin=int(min_hairpin), num_chunks=num_chunks,
                            method=_check_method(method))
    out = batch_sharded(run, probs)(probs, lengths, gamma)
    return out if batched else out[0]


# --------------------------------------------------------------------------- #
# sampling
# --------------------------------------------------------------------------- #

def pair_table_from_marks(marks, lengths):
    """0/1 pair marks in the engine's width layout ``[..., L(d), L(i)]`` (pair (i, i+d))
    -> pair tables ``[..., L]`` (partner or -1, -1 on padding)."""
    length = marks.shape[-1]
    lead = marks.shape[:-2]
    marks = marks.reshape((-1, length, length))
    opens = jnp.any(marks, axis=1)  # [N, i]
    partner = jnp.arange(length)[None, :] + jnp.argmax(marks, axis=1)  # j = i + d
    rows = jnp.arange(marks.shape[0])[:, None]
    table = jnp.full(marks.shape[::2], -1, jnp.int32)
    table = table.at[rows, jnp.where(opens, jnp.arange(length), length)].set(
        jnp.where(opens, partner, -1).astype(jnp.int32), mode="drop")
    table = table.at[rows, jnp.where(opens, partner, length)].set(
        jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), opens.shape), mode="drop")
    table = table.reshape(lead + (length,))
    return jnp.where(jnp.arange(length) < lengths[..., None], table, -1)


@functools.partial(jax.jit, static_argnames=("num_samples", "min_hairpin", "num_chunks", "no_lonely_pairs",
                                             "method"))
def _sample(key, params, tokens, lengths, phi, *, num_samples, min_hairpin, num_chunks, no_lonely_pairs=False,
            method="traceback"):
    problem, inputs = engine_inputs(params, tokens, lengths, phi, min_hairpin=min_hairpin, num_chunks=num_chunks,
                                    no_lonely_pairs=no_lonely_pairs)
    if method == "traceback":
        return jnp.swapaxes(traceback.traceback_tables(problem, "sample", key, inputs, lengths, num_samples), 0, 1)
    marks = chart.sample_pairs(problem, key, inputs, lengths, num_samples)  # [S, B, L, L]
    tables = pair_table_from_marks(marks, jnp.broadcast_to(lengths, marks.shape[:2]))
    return jnp.swapaxes(tables, 0, 1)


def sample_structures(key, params, tokens, num_samples, lengths=None, *, phi=None, min_hairpin=3,
                      num_chunks=DEFAULT_NUM_CHUNKS, no_lonely_pairs=False, method="traceback"):
    """``num_samples`` exact, independent samples from ``p(s | x) = e^{score(s)} / Z(x)``.

    One inside pass, then a stochastic traceback: each sample expands its cells top-down, one
    at a time, each cell choosing one alternative of its recursion with probability equal to
    that alternative's share of the cell's total (:func:`foldax.layers.traceback.traceback_tables`;
    the choice is the pullback of the grammar's own recursion in the sampling semiring). O(n)
    cell steps per sample, vectorised over samples and sequences. ``method="outside"`` draws
    each sample as a full outside pass in the sampling semiring instead
    (:func:`foldax.layers.chart.sample_pairs`; O(n^3) per sample).

    Args:
      key: a JAX PRNG key.
      num_samples: static int.
      params, tokens, lengths, phi, min_hairpin, no_lonely_pairs: as for
        :func:`foldax.layers.log_partition`.
      method: ``"traceback"`` or ``"outside"`` (:data:`METHODS`). The two draw from the same
        distribution, not the same samples for a key.

    Returns:
      int32 pair tables ``[num_samples, n]`` (or ``[B, num_samples, L]``, -1 on padding).

    Example:
      >>> import jax; from foldax import layers
      >>> tables = sample_structures(jax.random.key(0), layers.default_params(), layers.encode("GGGGAAACCCC"), 1000)
      >>> tables.shape, round(float((tables[:, 0] == 10).mean()), 1)  # pair_probs: P[0, 10] = 0.61
      ((1000, 11), 0.6)
    """
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ValueError(f"num_samples must be a non-negative int (static), got {num_samples!r}")
    params = check_params(params)
    no_lonely_pairs = check_no_lonely_pairs(params, no_lonely_pairs)
    tokens, lengths, phi, batched = _check_inputs(tokens, lengths, phi, min_hairpin)
    batch, length = tokens.shape
    if length == 0 or num_samples == 0:
        return jnp.zeros((batch, num_samples, length) if batched else (num_samples, length), jnp.int32)
    run = functools.partial(_sample, num_samples=int(num_samples), min_hairpin=int(min_hairpin),
                            num_chunks=num_chunks, no_lonely_pairs=no_lonely_pairs, method=_check_method(method))
    out = batch_sharded(run, tokens)(key, params, tokens, lengths, phi)
    return out if batched else out[0]
