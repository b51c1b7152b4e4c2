"""Semirings: the two ways the chart engine combines alternatives.

The engine is written once against this small interface; a semiring decides how
alternatives are added (``plus``/``sum``) and, for the backward pass, how the
adjoint of a sum is shared among its terms (``weights``):

* :data:`LOG` -- ``a (+) b = log(e^a + e^b)``: the chart holds log partition
  functions; the adjoint of a term is its share ``exp(term - total)``, so the
  gradient of log Z is the vector of expected feature counts (outside algorithm).
* :data:`MAX` -- ``a (+) b = max(a, b)``: the chart holds best scores (Viterbi);
  the adjoint goes to one arg-max term (ties: the first term), so the gradient is
  the indicator of the best structure.

Both are exact in floating point: no term can make a NaN, an all ``-inf`` sum is
``-inf``, and weights are finite and lie in [0, 1].
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


def _safe_max(x, axis):
    top = jnp.max(x, axis=axis, keepdims=True)
    return jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))


@dataclasses.dataclass(frozen=True)
class LogSemiring:
    """Log-sum-exp semiring (partition functions and marginals)."""

    name: str = "log"

    def plus(self, a, b):
        return jnp.logaddexp(a, b)

    def sum(self, x, axis=0):
        # Two passes (max, then exp-sum) keep every exp argument <= 0.
        top = _safe_max(x, axis)
        total = jnp.log(jnp.sum(jnp.exp(x - top), axis=axis, keepdims=True)) + top
        return jnp.squeeze(total, axis)

    def sum_from_below(self, x, lower, axis=0):
        """``sum(x, axis)`` in one exp pass, given ``lower <= sum(x, axis)``.

        Shifting by ``lower`` instead of the terms' max saves the max pass. The shifted
        sum is ``exp(total - lower) >= 1``, so nothing that matters underflows and its log
        stays small (full precision); it overflows only when the total exceeds ``lower``
        by ~88 (float32) or ~709 (float64). Returns ``(total, ok)``; where ``ok`` is
        False the caller must use :meth:`sum` instead.
        """
        shift = jnp.expand_dims(lower, axis)
        total = jnp.squeeze(jnp.log(jnp.sum(jnp.exp(x - shift), axis=axis, keepdims=True)) + shift, axis)
        return total, jnp.isfinite(total)

    def weights(self, x, total, axis=0):
        """d total / d x for ``total = sum(x, axis)``: softmax shares in [0, 1]."""
        total = jnp.expand_dims(total, axis)
        return jnp.where(total == -jnp.inf, 0.0, jnp.exp(x - total)).astype(x.dtype)

    def pair_weights(self, a, b, total):
        """d total / d a and d total / d b for ``total = plus(a, b)``."""
        finite = total != -jnp.inf
        zero = jnp.zeros_like(total)
        return (jnp.where(finite, jnp.exp(a - total), zero), jnp.where(finite, jnp.exp(b - total), zero))


@dataclasses.dataclass(frozen=True)
class MaxSemiring:
    """Max-plus (Viterbi) semiring (best structure and its score)."""

    name: str = "max"

    def plus(self, a, b):
        return jnp.maximum(a, b)

    def sum(self, x, axis=0):
        return jnp.max(x, axis=axis)

    def weights(self, x, total, axis=0):
        """One-hot of the first term that attains the maximum."""
        positions = jnp.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - 1 - axis))
        # A min-reduction over the tied positions (XLA's argmax is a much slower variadic reduce).
        tied = jnp.where(x == jnp.expand_dims(total, axis), positions, x.shape[axis])
        first = jnp.min(tied, axis=axis, keepdims=True)
        return (positions == first).astype(x.dtype)

    def pair_weights(self, a, b, total):
        del total
        first = (a >= b).astype(a.dtype)
        return first, 1 - first


LOG = LogSemiring()
MAX = MaxSemiring()
SEMIRINGS = {"log": LOG, "max": MAX}
