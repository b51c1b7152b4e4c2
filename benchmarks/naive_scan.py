"""The obvious, slow JAX inside algorithm: the baseline foldax is measured against.

Written the way the issue describes it: a `lax.scan` over diagonal offsets d that
carries the whole chart (P, Zn, Z as (n+1) x (n+1) arrays), does the bifurcation
as a logsumexp over full N-wide rows for all N rows every step, and writes the
new diagonal with `.at[i, j].set(..., mode="drop")`. That is ~6x the useful work
(n^3 terms instead of sum_d (n-d)(d-h-1)) plus a full chart copy per step, but
it is correct and is what one writes first.

Correctness without masks rests on the chart initialisation: P starts at -inf
and is only ever written on diagonals already finished, so at step d the row
P[i, :] is -inf for every split k that is not yet valid (k < i+h+1 or k >= j);
Z and Zn start at 0, which is exactly their value on empty spans (i = j+1).

Differentiable: ``jax.grad`` gives the expected counts of the parameters (reverse mode
through the scan, so it keeps every step's chart: O(n^3) memory). Rows without any
valid split are reduced with the double-``where`` of :func:`_reduce_rows`, so no NaN.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax


def _reduce_rows(reduce, rows, neg):
    """``reduce`` over each row, ``neg`` (-inf) for a row with no finite entry.

    A row of only -inf (no split point is valid yet) has value -inf but its logsumexp
    gradient is 0/0 = NaN, which ``0 * NaN`` carries into every parameter. The usual
    double ``where``: reduce a harmless row of zeros instead, then select -inf, so the
    unused branch's gradient is an exact 0.
    """
    live = jnp.any(rows > neg, axis=-1)
    safe = jnp.where(live[:, None], rows, 0)
    return jnp.where(live, reduce(safe), neg)


@partial(jax.jit, static_argnames=("min_hairpin", "semiring"))
def naive_log_partition(params, tokens, min_hairpin=3, phi=None, semiring="log"):
    """log Z(x) for one sequence `tokens` int32 [n]; `semiring="max"` gives the Viterbi score."""
    n = tokens.shape[0]
    if n == 0:
        return jnp.zeros((), params["pair"].dtype)
    dtype = params["pair"].dtype
    h = min_hairpin
    if semiring == "max":
        add, reduce = jnp.maximum, partial(jnp.max, axis=-1)
    else:
        add, reduce = jnp.logaddexp, partial(jax.nn.logsumexp, axis=-1)
    if phi is None:
        phi = jnp.zeros((n, n), dtype)

    i = jnp.arange(n)
    x = tokens
    x_next = jnp.take(x, i + 1, mode="clip")  # x_{i+1}; clipped only on spans we drop
    neg = jnp.array(-jnp.inf, dtype)
    P0 = jnp.full((n + 1, n + 1), neg)
    Z0 = jnp.zeros((n + 1, n + 1), dtype)

    def step(chart, d):
        P, Zn, Z = chart
        j = i + d
        jc = jnp.minimum(j, n - 1)  # clamp reads on out-of-range rows; their writes drop
        x_j, x_prev = x[jc], x[jnp.maximum(jc - 1, 0)]
        inner = add(params["stack"][x, x_j, x_prev, x_next] + P[i + 1, jc - 1],
                    params["loop"] + Zn[i + 1, jc - 1])
        p_new = params["pair"][x, x_j] + phi[i, jc] + inner
        p_new = jnp.where(d > h, p_new, neg)
        # Bifurcation over every k for every row: [i, k] = P[i, k] + Z[k+1, j_i].
        bif = _reduce_rows(reduce, P[:n, :n] + Z[1:, jc].T, neg)
        zn_new = add(params["unpaired"][x] + Z[i + 1, jc], bif)
        z_new = add(zn_new, p_new)
        jw = jnp.where(j < n, j, n + 1)  # out of bounds -> dropped
        P = P.at[i, jw].set(p_new, mode="drop")
        Zn = Zn.at[i, jw].set(zn_new, mode="drop")
        Z = Z.at[i, jw].set(z_new, mode="drop")
        return (P, Zn, Z), None

    (P, Zn, Z), _ = lax.scan(step, (P0, Z0, Z0), jnp.arange(n))
    return Z[0, n - 1]


@partial(jax.jit, static_argnames=("min_hairpin", "semiring"))
def naive_log_partition_batch(params, tokens, min_hairpin=3, phi=None, semiring="log"):
    """vmap of `naive_log_partition` over B equal-length sequences: tokens [B, n] -> [B]."""
    f = lambda t, p: naive_log_partition(params, t, min_hairpin, p, semiring)
    return jax.vmap(f)(tokens, phi)
