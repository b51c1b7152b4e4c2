"""Semirings: how the chart engine combines the alternatives of a recursion.

A grammar's recursion (``layers/stacking.py``, ``layers/turner.py``) is written once
against this small interface: ``plus(a, b)`` for two alternatives, ``sum(x, axis)`` for
many, and ``+`` of log-weights for a product. The semiring decides what a sum is and,
through the derivative of its sum, how an adjoint is shared among the terms:

* :data:`LOG` -- ``a (+) b = log(e^a + e^b)``: charts hold log partition functions and
  the adjoint of a term is its softmax share ``exp(term - total)``, so the gradient of
  log Z is the vector of expected feature counts (the outside algorithm).
* :data:`MAX` -- ``a (+) b = max(a, b)``: charts hold best scores and the adjoint goes
  to the first arg-max term, so the gradient is the indicator of the best structure.
* :class:`SampleSemiring` -- the values of :data:`LOG`, but the adjoint goes to *one*
  term drawn with probability ``exp(term - total)``: run backwards from the output
  with adjoint 1, it marks the cells of one exact sample of ``p(s | x)`` (a stochastic
  traceback written as an outside pass).

The derivative rules are ``jax.custom_jvp`` rules, so the recursions support forward
mode, reverse mode (by transposition) and forward-over-reverse (Hessian-vector
products). Each sum optionally takes ``known``, the total already computed by an
earlier pass: the outside pass re-runs a diagonal's recursion under ``jax.vjp`` with
the saved chart rows as ``known``, so a sum costs one exp pass (its shares) instead of
being recomputed. Everything is exact in floating point: an all ``-inf`` sum is
``-inf`` with zero shares, and no rule makes a NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

# ------------------------------------------------------------------------ log

def _finite_or_zero(x):
    return jnp.where(jnp.isfinite(x), x, jnp.zeros_like(x))


def _log_sum(x, axis):
    top = _finite_or_zero(jnp.max(x, axis=axis, keepdims=True))
    return jnp.squeeze(jnp.log(jnp.sum(jnp.exp(x - top), axis=axis, keepdims=True)) + top, axis)


def _share(x, total):
    """exp(x - total), 0 where the total is -inf (no alternative); no NaN even in the
    unselected branch, so that derivatives of the shares stay NaN-free too."""
    empty = total == -jnp.inf
    return jnp.where(empty, jnp.zeros_like(x), jnp.exp(x - jnp.where(empty, jnp.zeros_like(total), total)))


def _shares(x, total, axis):
    """d total / d x for total = log-sum-exp of x along axis."""
    return _share(x, jnp.expand_dims(total, axis))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _log_sum_known(x, known, axis):
    return known


@_log_sum_known.defjvp
def _log_sum_known_jvp(axis, primals, tangents):
    x, known = primals
    x_dot, _ = tangents  # the total's own tangent is implied by x's
    return known, jnp.sum(_shares(x, known, axis) * x_dot, axis=axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _log_sum_fresh(x, axis):
    return _log_sum(x, axis)


@_log_sum_fresh.defjvp
def _log_sum_fresh_jvp(axis, primals, tangents):
    (x,), (x_dot,) = primals, tangents
    # The total through this same rule, so that differentiating the shares again (second
    # derivatives) sees d total = sum(shares * dx), never the max's derivative at -inf.
    total = _log_sum_fresh(x, axis)
    return total, jnp.sum(_shares(x, total, axis) * x_dot, axis=axis)


@jax.custom_jvp
def _logaddexp(a, b):
    # Shifted by the finite max: no NaN even in unselected branches (both -inf gives -inf).
    top = _finite_or_zero(jnp.maximum(a, b))
    return jnp.log(jnp.exp(a - top) + jnp.exp(b - top)) + top


@_logaddexp.defjvp
def _logaddexp_jvp(primals, tangents):
    a, b = primals
    a_dot, b_dot = tangents
    total = _logaddexp(a, b)
    return total, _share(a, total) * a_dot + _share(b, total) * b_dot


@jax.custom_jvp
def _log_plus(a, b, known):
    return known


@_log_plus.defjvp
def _log_plus_jvp(primals, tangents):
    a, b, known = primals
    a_dot, b_dot, _ = tangents
    return known, _share(a, known) * a_dot + _share(b, known) * b_dot


@dataclasses.dataclass(frozen=True)
class LogSemiring:
    """Log-sum-exp semiring (partition functions and marginals)."""

    name: str = "log"

    def plus(self, a, b, known=None):
        """``log(e^a + e^b)``."""
        a, b = jnp.broadcast_arrays(a, b)
        return _logaddexp(a, b) if known is None else _log_plus(a, b, known)

    def sum(self, x, axis=0, known=None):
        """``log sum_k e^{x_k}`` along ``axis`` (two passes: the max, then the shifted exp-sum)."""
        return _log_sum_fresh(x, axis) if known is None else _log_sum_known(x, known, axis)

    def sum_from_below(self, x, lower, axis=0, known=None):
        """``sum(x, axis)`` in one exp pass, given ``lower <= sum(x, axis)``.

        Shifting by ``lower`` instead of the terms' max saves the max pass. The shifted
        sum is ``exp(total - lower) >= 1``, so nothing that matters underflows and its log
        stays small; it overflows only when the total exceeds ``lower`` by ~88 (float32)
        or ~709 (float64). Returns ``(total, ok)``; where ``ok`` is False the caller must
        use :meth:`sum` instead.
        """
        if known is not None:
            return _log_sum_known(x, known, axis), jnp.ones(known.shape, bool)
        shift = jnp.expand_dims(jax.lax.stop_gradient(lower), axis)
        total = jnp.squeeze(jnp.log(jnp.sum(jnp.exp(x - shift), axis=axis, keepdims=True)) + shift, axis)
        total = jax.lax.stop_gradient(total)
        return _log_sum_known(x, total, axis), jnp.isfinite(total)

    def for_diagonal(self, d):
        return self

    def for_output(self):
        return self

    def matmul(self, a, b):
        """``log sum_k exp(a[..., n, k] + b[..., k, c])`` -> [..., n, c]."""
        return self.sum(a[..., :, :, None] + b[..., None, :, :], axis=a.ndim - 1)


# ------------------------------------------------------------------------ max

def _positions(x, axis):
    """``0, 1, ...`` along ``axis`` (broadcastable against ``x``), as floats of ``x``'s kind (at
    least float32: exact far beyond any chart's size). Integer positions beside float terms cost
    the max semiring's outside pass ~15% more on CPU (measured at 500 nt)."""
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    return jnp.arange(x.shape[axis], dtype=dtype).reshape((-1,) + (1,) * (x.ndim - 1 - axis))


def _first_argmax_mask(x, total, axis):
    """One-hot of the first term equal to ``total`` along ``axis`` (ties: the first)."""
    positions = _positions(x, axis)
    # A min-reduction over the tied positions (XLA's argmax is a much slower variadic reduce).
    tied = jnp.where(x == jnp.expand_dims(total, axis), positions, jnp.inf)
    # Materialised: fused into the mask's consumers, the outside pass ran ~15% slower (measured).
    first = jax.lax.optimization_barrier(jnp.min(tied, axis=axis, keepdims=True))
    return positions == first


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _max_sum(x, known, axis):
    return known


@_max_sum.defjvp
def _max_sum_jvp(axis, primals, tangents):
    x, known = primals
    x_dot, _ = tangents
    mask = _first_argmax_mask(x, known, axis)
    return known, jnp.sum(jnp.where(mask, x_dot, jnp.zeros_like(x_dot)), axis=axis)


@jax.custom_jvp
def _max_plus(a, b):
    return jnp.maximum(a, b)


@_max_plus.defjvp
def _max_plus_jvp(primals, tangents):
    a, b = primals
    a_dot, b_dot = tangents
    return jnp.maximum(a, b), jnp.where(a >= b, a_dot, b_dot)


@dataclasses.dataclass(frozen=True)
class MaxSemiring:
    """Max-plus (Viterbi) semiring (best structure and its score)."""

    name: str = "max"

    def plus(self, a, b, known=None):
        a, b = jnp.broadcast_arrays(a, b)
        return _max_plus(a, b)

    def sum(self, x, axis=0, known=None):
        return _max_sum(x, jnp.max(x, axis=axis) if known is None else known, axis)

    def sum_from_below(self, x, lower, axis=0, known=None):
        total = self.sum(x, axis, known)
        return total, jnp.ones(total.shape, bool)

    def for_diagonal(self, d):
        return self

    def for_output(self):
        return self

    def matmul(self, a, b):
        """``max_k a[..., n, k] + b[..., k, c]`` -> [..., n, c]."""
        return self.sum(a[..., :, :, None] + b[..., None, :, :], axis=a.ndim - 1)


# --------------------------------------------------------------------- sample

def _sampled_mask(x, total, u, axis):
    """One-hot of a term drawn with probability exp(x - total), by inverting the CDF at u."""
    w = _shares(x, total, axis)
    cdf = jnp.cumsum(w, axis=axis)
    mass = jnp.take(cdf, jnp.array([-1]), axis=axis)
    positions = _positions(x, axis)
    k = jnp.sum(cdf <= jnp.expand_dims(u, axis) * mass, axis=axis, keepdims=True, dtype=positions.dtype)
    # Rounding can put u * mass at the very end: never pick a zero-share tail entry.
    last = jnp.max(jnp.where(w > 0, positions, 0), axis=axis, keepdims=True)
    return positions == jnp.minimum(k, last)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _sample_sum(x, known, u, axis):
    return known


@_sample_sum.defjvp
def _sample_sum_jvp(axis, primals, tangents):
    x, known, u = primals
    x_dot = tangents[0]
    mask = _sampled_mask(x, known, u, axis)
    return known, jnp.sum(jnp.where(mask, x_dot, jnp.zeros_like(x_dot)), axis=axis)


@jax.custom_jvp
def _sample_plus(a, b, known, u):
    return known


@_sample_plus.defjvp
def _sample_plus_jvp(primals, tangents):
    a, b, known, u = primals
    a_dot, b_dot = tangents[:2]
    return known, jnp.where(u < _share(a, known), a_dot, b_dot)


class SampleSemiring:
    """LOG's values; adjoints go to one term drawn from the softmax (exact sampling).

    ``SampleSemiring(key)`` draws fresh uniforms for every sum of every diagonal:
    :meth:`for_diagonal` folds the diagonal into the key and each sum call folds a
    counter (the recursion is traced in a fixed order, so the draws are reproducible).
    ``SampleSemiring(None, uniforms=u)`` takes its sums' uniforms in order from the flat array
    ``u`` instead (one draw for a whole recursion: on CPU each ``jax.random`` call is a loop of
    its own). ``uniforms_used`` counts them, so a first trace with ``SampleSemiring(None)``
    (whose draws are placeholders) can size ``u``.
    """

    name = "sample"

    def __init__(self, key, *, uniforms=None):
        self.key = key
        self.uniforms = uniforms
        self._calls = 0
        self.uniforms_used = 0

    def for_diagonal(self, d):
        return SampleSemiring(jax.random.fold_in(self.key, d))

    def for_output(self):
        """The output's draws: a key branch apart from every diagonal's."""
        return SampleSemiring(jax.random.fold_in(self.key, 0x7FFFFFFE))

    def matmul(self, a, b):
        return self.sum(a[..., :, :, None] + b[..., None, :, :], axis=a.ndim - 1)

    def _uniform(self, shape, dtype):
        size, start = math.prod(shape), self.uniforms_used
        self.uniforms_used += size
        if self.uniforms is not None:
            if self.uniforms_used > self.uniforms.shape[-1]:
                raise ValueError(f"SampleSemiring: {self.uniforms.shape[-1]} uniforms given, the recursion "
                                 f"takes at least {self.uniforms_used}")
            return self.uniforms[start : start + size].reshape(shape).astype(dtype)
        if self.key is None:  # counting only: a trace that sizes ``uniforms`` (its values unused)
            return jnp.full(shape, 0.5, dtype)
        # Draws live in their own branch of the key, apart from the diagonals' keys.
        self._calls += 1
        draws = jax.random.fold_in(jax.random.fold_in(self.key, 0x7FFFFFFF), self._calls)
        return jax.random.uniform(draws, shape, dtype)

    def plus(self, a, b, known=None):
        a, b = jnp.broadcast_arrays(a, b)
        total = jnp.logaddexp(a, b) if known is None else known
        return _sample_plus(a, b, total, self._uniform(total.shape, total.dtype))

    def sum(self, x, axis=0, known=None):
        total = _log_sum(x, axis) if known is None else known
        return _sample_sum(x, total, self._uniform(total.shape, total.dtype), axis)

    def sum_from_below(self, x, lower, axis=0, known=None):
        total = self.sum(x, axis, known)
        return total, jnp.ones(total.shape, bool)


LOG = LogSemiring()
MAX = MaxSemiring()
SEMIRINGS = {"log": LOG, "max": MAX}
