"""The chart engine: one inside pass and one outside (adjoint) pass for any semiring.

Grammar (0-based inclusive spans; empty spans have Z = Zn = 0, P = -inf)::

    P[i][j]  = pair[x_i,x_j] + phi[i][j]
               + ( stack[x_i,x_j,x_{j-1},x_{i+1}] + P[i+1][j-1]  (+)  loop + Zn[i+1][j-1] )
               if j - i > h, else -inf
    Zn[i][j] = unpaired[x_i] + Z[i+1][j]  (+)  SUM_{k=i+h+1}^{j-1} P[i][k] + Z[k+1][j]
    Z[i][j]  = Zn[i][j] (+) P[i][j]

The engine folds the unpaired term into the split-point sum: with the *left
factor* ``F[i][i] = unpaired[x_i]`` and ``F[i][k] = P[i][k]`` (``k > i``),
``Zn[i][j] = SUM_{k=i}^{j-1} F[i][k] + Z[k+1][j]``. That one reduction is the
O(n^3) work; everything else is O(n) per diagonal.

Layout (why it is fast). The chart is filled one diagonal ``d = j - i`` at a
time, in a ``fori_loop``. Charts are stored *by width*, one [width, position] matrix per sequence:

* ``F[b, w, i]``  = F[i][i+w]            (indexed by span start)
* ``Zn[b, w+1, i]`` = Zn[i][i+w]         (row 0: the empty span)
* ``Zr[b, L-w, j]`` = Z[j-w][j]          (indexed by span end, width reversed)

For diagonal d, the split terms of all cells are ``F[m, i] + Z[i+m+1][i+d]``
for m = 0..d-1; in this layout they are two plain rectangular slices,
``F[:, 0:M, 0:C]`` and ``Zr[:, L-d+1 : L-d+1+M, d : d+C]``, added and reduced
over the width axis: no gathers, no per-cell scatters, and each finished diagonal is
written back as one contiguous row. Slices must have static shapes, so the
diagonals are split into a few *chunks*; a chunk [d0, d1) uses M = d1 - 1 rows
and C = L - d0 columns, which hugs the triangular band (about 25% padding with
the automatic 16 chunks at L >= 512; each chunk costs ~0.4 s of compile time) instead
of computing full L x L rows. Uncomputed cells
hold -inf (F) or 0 (Z), so padding rows and columns never contribute. Reductions
run over the width axis and vectorise along positions, so a batch costs no more
per sequence than a single call (a size-1 batch axis innermost would cost 5x);
``jax.vmap`` is folded into that batch axis (``custom_vmap``).

One exp pass per diagonal. A log-sum-exp is usually two passes over the terms (the
max, then the shifted exp-sum). Here the shift is a lower bound known from the
previous diagonal, ``Zn[i][j] >= Zn[i][j-1] + unpaired[x_j]`` (j left unpaired),
which saves the max pass (~10% of the forward time at n = 800). The shifted sum is
then >= 1, so it cannot underflow; if it overflows (the total exceeds the bound by
~88 in float32, e.g. with scores ~ 100), the chart is refilled with two-pass sums
(``FALLBACK_CHUNKS`` chunks, ~3x slower): the result is exact either way.

Backward: the adjoint of each cell is pushed to its children in reverse diagonal
order, re-deriving the split weights from the saved O(L^2) charts (semiring
``weights``: softmax shares for LOG, arg-max indicators for MAX). Memory stays
O(L^2 B); nothing of size L^3 is stored.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from layers.semiring import SEMIRINGS

#: Upper limit of the automatic chunk count (see ``auto_num_chunks``).
MAX_AUTO_CHUNKS = 16
#: ``num_chunks=None`` everywhere means ``auto_num_chunks(L)``.
DEFAULT_NUM_CHUNKS = None


@functools.lru_cache(maxsize=256)
def diagonal_chunks(length: int, num_chunks: int = MAX_AUTO_CHUNKS) -> tuple[tuple[int, int], ...]:
    """Splits diagonals 0..length-1 into at most ``num_chunks`` runs [d0, d1).

    Chosen by dynamic programming over boundaries on a coarse grid to minimise
    the padded work ``sum (d1 - d0) * (d1 - 1) * (length - d0)`` of the chunks.
    """
    if length <= 0:
        return ()
    step = max(1, -(-length // 128))
    grid = np.unique(np.append(np.arange(0, length, step), length))
    g = len(grid)
    k = min(num_chunks, g - 1)
    d0 = grid[:, None].astype(np.float64)
    d1 = grid[None, :].astype(np.float64)
    cost = np.where(d1 > d0, (d1 - d0) * np.maximum(d1 - 1, 1) * (length - d0), np.inf)
    best = np.full((k + 1, g), np.inf)
    arg = np.zeros((k + 1, g), dtype=np.int64)
    best[0, 0] = 0.0
    for c in range(1, k + 1):
        total = best[c - 1][:, None] + cost
        arg[c] = np.argmin(total, axis=0)
        best[c] = total[arg[c], np.arange(g)]
    c = int(np.argmin(best[:, -1]))
    bounds, end = [], g - 1
    while c > 0:
        start = int(arg[c, end])
        bounds.append((int(grid[start]), int(grid[end])))
        end, c = start, c - 1
    return tuple(reversed(bounds))


def auto_num_chunks(length: int) -> int:
    """Default chunk count: short charts compile fast, long ones waste little work."""
    return max(1, min(MAX_AUTO_CHUNKS, length // 32))


def _geometry(length: int, num_chunks: int | None):
    chunks = diagonal_chunks(length, auto_num_chunks(length) if num_chunks is None else num_chunks)
    widest = max((d1 - d0 for d0, d1 in chunks), default=1)
    return chunks, widest


def _row(chart, row, col, width):
    """chart[:, row, col:col+width] with dynamic row/col, as [B, width]."""
    return lax.dynamic_slice(chart, (0, row, col), (chart.shape[0], 1, width))[:, 0]


def _put_row(chart, values, row, col):
    return lax.dynamic_update_slice(chart, values[:, None], (0, row, col))


def _add_block(chart, values, row, col):
    block = lax.dynamic_slice(chart, (0, row, col), values.shape)
    return lax.dynamic_update_slice(chart, block + values, (0, row, col))


class _Cells:
    """Per-diagonal views shared by the inside and outside passes."""

    def __init__(self, scores, charts, d, width, min_hairpin, semiring):
        pair_w, stack_w, _, loop = scores
        F, Zn, Zr = charts
        neg_inf = jnp.array(-jnp.inf, F.dtype)
        self.has_pair = d > min_hairpin
        self.has_stack = d - 2 > min_hairpin
        self.pair = _row(pair_w, d, 0, width)
        self.stacked = jnp.where(
            self.has_stack, _row(stack_w, d, 0, width) + _row(F, d - 2, 1, width), neg_inf
        )
        self.looped = jnp.reshape(loop, (-1, 1)) + _row(Zn, d - 1, 1, width)
        self.inner = semiring.plus(self.stacked, self.looped)
        self.p = jnp.where(self.has_pair, self.pair + self.inner, neg_inf)


def _split_terms(F, Zr, d, rows, width, length):
    left = F[:, :rows, :width]
    right = lax.dynamic_slice(Zr, (0, length - d + 1, d), (F.shape[0], rows, width))
    return left + right


#: Chunks of the exact re-run after a one-pass overflow (few: it is rare, and each
#: chunk is another loop body to compile).
FALLBACK_CHUNKS = 4


def _fill_charts(scores, length, min_hairpin, semiring, num_chunks):
    pair_w, _, unpaired, _ = scores
    batch, dtype = pair_w.shape[0], pair_w.dtype
    chunks, widest = _geometry(length, num_chunks)
    one_pass = hasattr(semiring, "sum_from_below")  # the log semiring; a max is one pass anyway
    if one_pass and chunks:
        # Merged runs of the same chunks: every diagonal's exact row then covers at least
        # the columns of its one-pass row, so the outside pass sees consistent charts.
        exact_chunks = tuple(
            (chunks[run[0]][0], chunks[run[-1]][1])
            for run in np.array_split(np.arange(len(chunks)), min(FALLBACK_CHUNKS, len(chunks)))
        )
        widest = max(d1 - d0 for d0, d1 in exact_chunks)
    else:
        exact_chunks = chunks
    neg_inf = jnp.array(-jnp.inf, dtype)

    def blank():
        # One spare row: diagonal 0 writes its (empty) P row to row 1, never over row 0.
        F = jnp.full((batch, length + 1, length + 1), -jnp.inf, dtype).at[:, 0, :length].set(unpaired)
        Zn = jnp.zeros((batch, length + 1, length + 1), dtype)
        Zr = jnp.zeros((batch, length + widest + 2, length + widest + 1), dtype)
        return F, Zn, Zr, jnp.zeros(batch, bool)

    def step(exact, rows, width, d, state):
        F, Zn, Zr, overflow = state
        charts = (F, Zn, Zr)
        # Materialised once: read through the dynamic slice of Zr inside the exp loop,
        # the split terms cost ~25% more (measured).
        terms = lax.optimization_barrier(_split_terms(F, Zr, d, rows, width, length))
        if exact or not one_pass:
            zn = semiring.sum(terms, axis=1)
        else:
            # Zn[i][j] >= Zn[i][j-1] + unpaired[x_j] (j left unpaired): a lower bound that
            # lets the log semiring sum in one exp pass instead of a max pass and an exp pass.
            lower = lax.optimization_barrier(_row(Zn, d, 0, width) + _row(F, 0, d, width))
            zn, ok = semiring.sum_from_below(terms, lower, axis=1)
            live = jnp.arange(width) < length - d
            # Flagged per sequence: a flag shared by the batch would cost a cross-device
            # reduction on every diagonal when the batch is sharded.
            overflow = overflow | jnp.any(live & ~ok, axis=1)
        if one_pass:
            # Cells past the chart's end (i + d >= L) are never read: -inf keeps them inert.
            zn = jnp.where(jnp.arange(width) < length - d, zn, neg_inf)
        p = _Cells(scores, charts, d, width, min_hairpin, semiring).p
        z = semiring.plus(zn, p)
        # Materialise the new rows before writing them: otherwise XLA fuses their
        # computation into the in-place row updates, and the fused update must then
        # copy the whole chart every diagonal (O(L^3) memory traffic).
        zn, p, z = lax.optimization_barrier((zn, p, z))
        # Row 0 of F holds the unpaired scores; P of width 0 does not exist.
        F = _put_row(F, p, jnp.maximum(d, 1), 0)
        Zn = _put_row(Zn, zn, d + 1, 0)
        Zr = _put_row(Zr, z, length - d, d)
        return F, Zn, Zr, overflow

    def fill(state, exact, chunks):
        for d0, d1 in chunks:
            state = lax.fori_loop(d0, d1, functools.partial(step, exact, max(d1 - 1, 1), length - d0), state)
        return state

    state = fill(blank(), False, chunks)
    if one_pass:
        # A one-pass sum overflowed somewhere (scores of order 100): refill the charts
        # from scratch with two-pass sums. One check per call, not per diagonal: a
        # per-diagonal cond synchronises the devices of a sharded batch every diagonal
        # (measured 1.7x slower at 32 x 128 on 2 devices); a while loop was 2x slower.
        state = lax.cond(jnp.any(state[3]), lambda s: fill(blank(), True, exact_chunks), lambda s: s, state)
    return state[:3]


@functools.lru_cache(maxsize=256)
def _charts_program(length, min_hairpin, semiring, num_chunks):
    """The inside pass for one static geometry, with ``jax.vmap`` folded into its batch axis.

    Under ``vmap`` every mapped instance becomes more sequences of the engine's own
    batch, so a mapped single-sequence call runs the batched program (and the overflow
    fallback stays a ``lax.cond`` instead of a ``select`` that runs both branches).
    """

    @jax.custom_batching.custom_vmap
    def charts(pair_w, stack_w, unpaired, loop):
        return _fill_charts((pair_w, stack_w, unpaired, loop), length, min_hairpin, semiring, num_chunks)

    @charts.def_vmap
    def _batched(axis_size, in_batched, *args):
        args = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(args, in_batched)]
        batch = args[0].shape[1]
        out = charts(*(a.reshape((axis_size * batch,) + a.shape[2:]) for a in args))
        return tuple(c.reshape((axis_size, batch) + c.shape[1:]) for c in out), (True,) * len(out)

    return charts


def _inside_charts(scores, length, min_hairpin, semiring, num_chunks):
    pair_w, stack_w, unpaired, loop = scores
    loop = jnp.broadcast_to(loop, pair_w.shape[:1])  # one per sequence, so vmap can fold it in
    return _charts_program(length, min_hairpin, semiring, num_chunks)(pair_w, stack_w, unpaired, loop)


def _outside(scores, charts, seeds, length, min_hairpin, semiring, num_chunks):
    """Adjoints of the cell scores given d(out)/d(Z[0][n_b - 1]) = seeds[b]."""
    pair_w = scores[0]
    F, Zn, Zr = charts
    dtype = F.dtype
    chunks, _ = _geometry(length, num_chunks)
    gF, gZn, gZr = jnp.zeros_like(F), jnp.zeros_like(Zn), jnp.zeros_like(Zr)
    gZr = gZr + seeds  # seeds: one-hot at each output cell
    g_pair = jnp.zeros_like(pair_w)
    g_stack = jnp.zeros_like(pair_w)
    g_loop = jnp.zeros(pair_w.shape[0], dtype)

    def step(rows, width, d, carry):
        gF, gZn, gZr, g_pair, g_stack, g_loop = carry
        cells = _Cells(scores, charts, d, width, min_hairpin, semiring)
        terms = _split_terms(F, Zr, d, rows, width, length)
        zn = _row(Zn, d + 1, 0, width)
        z = _row(Zr, length - d, d, width)
        w_zn, w_p = semiring.pair_weights(zn, cells.p, z)
        g_z = _row(gZr, length - d, d, width)
        g_zn = _row(gZn, d + 1, 0, width) + g_z * w_zn
        g_p = jnp.where(cells.has_pair, _row(gF, d, 0, width) + g_z * w_p, 0)
        # The pair's inner alternatives: stacked on P[i+1][j-1], or a loop over Zn[i+1][j-1].
        w_stack, w_loop = semiring.pair_weights(cells.stacked, cells.looped, cells.inner)
        g_stacked = jnp.where(cells.has_stack, g_p * w_stack, 0)
        g_looped = g_p * w_loop
        # As in the inside pass: materialise the new values before updating the adjoint
        # charts in place (the shares once: fusing them into both block updates would
        # compute every exp twice, measured 30% slower on a 32 x 256 batch).
        # Split points: F[m, i] and Z[i+m+1][i+d] each receive the term's share.
        share = g_zn[:, None] * semiring.weights(terms, zn, axis=1)
        share, g_p, g_stacked, g_looped = lax.optimization_barrier((share, g_p, g_stacked, g_looped))
        gF = _add_block(gF, share, 0, 0)
        gZr = _add_block(gZr, share, length - d + 1, d)
        gF = _add_block(gF, g_stacked[:, None], jnp.maximum(d - 2, 1), 1)
        gZn = _add_block(gZn, g_looped[:, None], jnp.maximum(d - 1, 0), 1)
        g_pair = _put_row(g_pair, g_p, d, 0)
        g_stack = _put_row(g_stack, g_stacked, d, 0)
        g_loop = g_loop + jnp.sum(g_looped, axis=1)
        return gF, gZn, gZr, g_pair, g_stack, g_loop

    carry = (gF, gZn, gZr, g_pair, g_stack, g_loop)
    for d0, d1 in reversed(chunks):
        body = functools.partial(step, max(d1 - 1, 1), length - d0)
        carry = lax.fori_loop(0, d1 - d0, lambda t, c, body=body, d1=d1: body(d1 - 1 - t, c), carry)
    gF, gZn, gZr, g_pair, g_stack, g_loop = carry
    g_unpaired = gF[:, 0, :length]
    return g_pair, g_stack, g_unpaired, g_loop


def _output_index(lengths, length):
    """Row/column of Z[0][n-1] in the Zr chart (n >= 1)."""
    n = jnp.clip(lengths, 1, length)
    return length - (n - 1), n - 1


def _read_output(Zr, lengths, length):
    rows, cols = _output_index(lengths, length)
    values = Zr[jnp.arange(Zr.shape[0]), rows, cols]
    return jnp.where(lengths > 0, values, jnp.zeros_like(values))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def inside_from_scores(pair_w, stack_w, unpaired, loop, lengths, length, min_hairpin, semiring, num_chunks):
    """Z[0][n_b - 1] for each sequence b from per-cell scores (see ``cell_scores``).

    ``pair_w[b, d, i]`` is ``pair[x_i, x_{i+d}] + phi[i, i+d]``, ``stack_w[b, d, i]`` the
    stacking score of the pair (i, i+d), ``unpaired[b, i]`` and ``loop`` as in the
    grammar. Differentiable (reverse mode) in every float argument with O(L^2 B) memory.
    """
    scores = (pair_w, stack_w, unpaired, loop)
    charts = _inside_charts(scores, length, min_hairpin, SEMIRINGS[semiring], num_chunks)
    return _read_output(charts[2], lengths, length)


def _inside_fwd(pair_w, stack_w, unpaired, loop, lengths, length, min_hairpin, semiring, num_chunks):
    scores = (pair_w, stack_w, unpaired, loop)
    charts = _inside_charts(scores, length, min_hairpin, SEMIRINGS[semiring], num_chunks)
    return _read_output(charts[2], lengths, length), (scores, charts, lengths)


def _inside_bwd(length, min_hairpin, semiring, num_chunks, residuals, g):
    scores, charts, lengths = residuals
    Zr = charts[2]
    rows, cols = _output_index(lengths, length)
    g = jnp.where(lengths > 0, g, jnp.zeros_like(g))
    seeds = jnp.zeros_like(Zr).at[jnp.arange(Zr.shape[0]), rows, cols].add(g)
    g_pair, g_stack, g_unpaired, g_loop = _outside(
        scores, charts, seeds, length, min_hairpin, SEMIRINGS[semiring], num_chunks
    )
    g_loop = jnp.sum(g_loop).reshape(jnp.shape(scores[3])).astype(scores[3].dtype)
    return g_pair, g_stack, g_unpaired, g_loop, None


inside_from_scores.defvjp(_inside_fwd, _inside_bwd)


def inside_charts_from_scores(pair_w, stack_w, unpaired, loop, *, length, min_hairpin, semiring, num_chunks=None):
    """The filled charts ``(F, Zn, Zr)`` in the engine's layout (for tracebacks)."""
    scores = (pair_w, stack_w, unpaired, loop)
    return _inside_charts(scores, length, min_hairpin, SEMIRINGS[semiring], num_chunks)
