"""The chart engine: one recursion per grammar; inside, outside, max, sampling and
Hessian-vector products all derived from it.

A *grammar* (``layers/stacking.py``, ``layers/turner.py``) writes its recursion once,
as a pure function of the finished smaller diagonals: ``step(sr, d, views, consts,
known, exact)`` returns the new rows of its charts for diagonal ``d = j - i``, given
``views`` -- rectangular slices of earlier rows of the charts and of the per-cell score
arrays that the grammar names with :class:`View` -- and a semiring ``sr``
(``layers/semiring.py``). The engine

* fills the charts diagonal by diagonal (**inside**; :func:`fill`) in a ``fori_loop``
  per static-shape chunk of diagonals, writing each finished row back in place;
* runs the diagonals in reverse with ``jax.vjp`` of the same ``step`` over the saved
  charts (**outside**; :func:`outside`): each diagonal's row adjoints go in, the
  adjoints of its views come out and are added back into adjoint charts at the same
  places. Memory stays O(L^2) per sequence; a grammar writes no adjoint code;
* gets the best structure from the max semiring and exact samples from
  :class:`~foldax.layers.semiring.SampleSemiring` in the same outside pass (the "gradient" is a
  one-hot choice), or, cell by cell, from the same ``step`` run for one cell at a time
  (``layers/traceback.py``: only the chosen cells); and second derivatives from ``jax.jvp`` of
  inside + outside (forward mode through both loops, O(L^2) memory; see :func:`value`).

Layout (why it is fast). Charts are stored *by width*: ``chart[b, w, i]`` is the cell
(i, i + w) (a grammar may shift rows, e.g. ``w + 1``), and charts used as the right
factor of split sums are also stored *by end, width reversed*: ``chart_r[b, L - w, j]``
is the cell (j - w, j). For diagonal d, the split terms ``left[i][k] + right[k+1][i+d]``
of all cells are then two plain rectangular slices, added and reduced over the width
axis: no gathers, no per-cell scatters, and each finished diagonal is written back as
one contiguous row. Slices need static shapes, so the diagonals are split into a few
*chunks* [d0, d1) (``diagonal_chunks``): a chunk reads ``rows`` (~ d1) rows and ``L - d0``
columns, hugging the triangle (about 25% padding with the automatic 16 chunks at
L >= 512) instead of computing full L x L rows. Uncomputed cells keep their initial
value (``-inf`` or 0), so padding never contributes. Reductions run over the width axis
and vectorise along positions, so a batch costs no more per sequence than a single
call; ``jax.vmap`` is folded into that batch axis (``custom_vmap``).

Each new row is materialised before it is written (``lax.optimization_barrier``):
otherwise XLA fuses its computation into the in-place row update, and the fused update
copies the whole chart every diagonal (O(L^3) memory traffic). In the outside pass each
sum is handed its saved total (``known``), so its shares cost one exp pass and nothing
is recomputed twice.

One exp pass per diagonal (stacking grammar). A log-sum-exp is two passes over the
terms (the max, then the shifted exp-sum). A grammar that knows a lower bound of a sum
(stacking: ``Zn[i][j] >= Zn[i][j-1] + unpaired[x_j]``) may sum in one exp pass
(``sum_from_below``) and report overflow (a total ~88 above the bound in float32); the
engine then refills the charts with two-pass sums (``FALLBACK_CHUNKS`` chunks, ~3x
slower) under one ``lax.cond`` per call, so the result is exact either way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from foldax.layers.semiring import LOG, MAX, SampleSemiring

#: Upper limit of the automatic chunk count (see ``auto_num_chunks``); each grammar sets its own
#: (``max_auto_chunks``: each chunk is a loop body that XLA compiles on its own).
MAX_AUTO_CHUNKS = 16
#: ``num_chunks=None`` everywhere means ``auto_num_chunks(L, grammar.max_auto_chunks)``.
DEFAULT_NUM_CHUNKS = None
#: Chunks of the exact re-run after a one-pass overflow (few: it is rare, and each
#: chunk is another loop body to compile).
FALLBACK_CHUNKS = 4


# ------------------------------------------------------------------ geometry

@functools.lru_cache(maxsize=256)
def diagonal_chunks(length: int, num_chunks: int = MAX_AUTO_CHUNKS, cell_cost: int = 0,
                    row_offset: int = 1) -> tuple[tuple[int, int], ...]:
    """Splits diagonals 0..length-1 into at most ``num_chunks`` runs [d0, d1).

    Chosen by dynamic programming over boundaries on a coarse grid to minimise the
    padded work ``sum (d1 - d0) * (d1 - row_offset + cell_cost) * (length - d0)`` of the
    chunks (a chunk reads ``d1 - row_offset`` split rows plus ``cell_cost`` fixed terms
    per cell for ``length - d0`` cells on each of its diagonals).
    """
    if length <= 0:
        return ()
    step = max(1, -(-length // 128))
    grid = np.unique(np.append(np.arange(0, length, step), length))
    g = len(grid)
    k = min(num_chunks, g - 1)
    d0 = grid[:, None].astype(np.float64)
    d1 = grid[None, :].astype(np.float64)
    rows = np.maximum(d1 - row_offset, 1) + cell_cost
    cost = np.where(d1 > d0, (d1 - d0) * rows * (length - d0), np.inf)
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


def auto_num_chunks(length: int, max_chunks: int = MAX_AUTO_CHUNKS) -> int:
    """Default chunk count: short charts compile fast, long ones waste little work."""
    return max(1, min(max_chunks, length // 32))


@dataclasses.dataclass(frozen=True)
class View:
    """A slice ``array[..., row : row + rows, col : col + cols]`` read by a step (all leading axes).

    ``row`` and ``col`` may be traced (they depend on the diagonal); ``rows`` and
    ``cols`` are static. Out-of-range starts are clamped like ``lax.dynamic_slice``
    (the grammar masks what it reads there). ``array`` names a chart or a score array.
    """

    array: str
    row: Any
    col: Any
    rows: int
    cols: int


# Arrays are [B, ..., rows, cols]: views and row writes address the last two axes and keep
# the leading ones (e.g. several per-cell score arrays stacked on an axis, read at once).

def _start(array, row, col):
    return (0,) * (array.ndim - 2) + (row, col)


def _read(array, view: View):
    return lax.dynamic_slice(array, _start(array, view.row, view.col), array.shape[:-2] + (view.rows, view.cols))


def _read_row(array, row, col, width):
    return lax.dynamic_slice(array, _start(array, row, col), array.shape[:-2] + (1, width))[..., 0, :]


def _put_row(array, values, row, col):
    return lax.dynamic_update_slice(array, values[..., None, :].astype(array.dtype), _start(array, row, col))


def _add_block(array, values, row, col):
    block = lax.dynamic_slice(array, _start(array, row, col), values.shape)
    return lax.dynamic_update_slice(array, block + values, _start(array, row, col))


# --------------------------------------------------------------- the engine

@dataclasses.dataclass(frozen=True)
class Problem:
    """Static description of one engine run: grammar, padded length, chunking."""

    grammar: Any
    length: int
    num_chunks: int | None = None

    @functools.cached_property
    def chunks(self):
        if self.num_chunks is None:
            n = auto_num_chunks(self.length, self.grammar.max_auto_chunks)
        else:
            n = self.num_chunks
        return diagonal_chunks(self.length, n, self.grammar.cell_cost, self.grammar.row_offset)

    @functools.cached_property
    def exact_chunks(self):
        """Merged runs of ``chunks`` for the exact refill: each diagonal's exact row then
        covers at least the columns of its one-pass row, so the outside pass (which uses
        ``chunks``) sees consistent charts."""
        if not self.chunks:
            return ()
        runs = np.array_split(np.arange(len(self.chunks)), min(FALLBACK_CHUNKS, len(self.chunks)))
        return tuple((self.chunks[r[0]][0], self.chunks[r[-1]][1]) for r in runs)

    @property
    def widest(self):
        spans = self.exact_chunks if self.grammar.one_pass else self.chunks
        return max((d1 - d0 for d0, d1 in spans), default=1)


def _arrays(inputs, charts):
    return {**inputs["arrays"], **charts}


def _writes(grammar, d, length, width):
    """The grammar's row writes of diagonal d as name -> (row, col, size); size defaults to
    the chunk's width (a grammar may write packed rows of another, static size)."""
    return {name: (w[0], w[1], w[2] if len(w) > 2 else width) for name, w in grammar.writes(d, length).items()}


def _fill_chunks(problem: Problem, sr, inputs, charts, chunks, exact):
    grammar, length = problem.grammar, problem.length
    consts = inputs["consts"]
    batch = next(iter(charts.values())).shape[0]

    def step(rows, width, d, state):
        charts, overflow = state
        arrays = _arrays(inputs, charts)
        views = {k: _read(arrays[v.array], v) for k, v in grammar.views(d, rows, width, length).items()}
        out, ok = grammar.step(sr.for_diagonal(d), d, views, consts, known={}, exact=exact, length=length)
        out = lax.optimization_barrier(out)
        charts = dict(charts)
        for name, (row, col, _) in _writes(grammar, d, length, width).items():
            charts[name] = _put_row(charts[name], out[name], row, col)
        if ok is not None:
            # Flagged per sequence: a flag shared by the batch would cost a cross-device
            # reduction on every diagonal when the batch is sharded.
            live = jnp.arange(width) < length - d
            overflow = overflow | jnp.any(live & ~ok, axis=1)
        return charts, overflow

    state = (charts, jnp.zeros(batch, bool))
    for d0, d1 in chunks:
        rows, width = grammar.block(d0, d1, length)
        state = lax.fori_loop(max(d0, grammar.first_diagonal), d1, functools.partial(step, rows, width), state)
    return state


def fill(problem: Problem, sr, inputs):
    """The inside pass: every chart filled (a dict of [B, ...] arrays)."""
    grammar = problem.grammar
    one_pass = grammar.one_pass and sr is LOG

    def blank():
        return grammar.init_charts(inputs, problem.length, problem.widest)

    charts, overflow = _fill_chunks(problem, sr, inputs, blank(), problem.chunks, exact=not one_pass)
    if one_pass:
        # A one-pass sum overflowed somewhere (scores of order 100): refill the charts
        # from scratch with two-pass sums. One check per call, not per diagonal: a
        # per-diagonal cond synchronises the devices of a sharded batch every diagonal
        # (measured 1.7x slower at 32 x 128 on 2 devices); a while loop was 2x slower.
        charts = lax.cond(jnp.any(overflow),
                          lambda c: _fill_chunks(problem, sr, inputs, blank(), problem.exact_chunks, True)[0],
                          lambda c: c, charts)
    return charts


def outside(problem: Problem, sr, inputs, charts, seeds):
    """Adjoints of ``inputs`` given the adjoints ``seeds`` of the charts (the outside pass).

    Runs the diagonals in reverse; each one is the ``jax.vjp`` of the grammar's ``step``
    at the saved charts, with the saved rows handed to the step as ``known`` totals.
    Returns ``(grads of inputs, grads of the charts' initial values)``.
    """
    grammar, length = problem.grammar, problem.length
    arrays = _arrays(inputs, charts)
    grads = {k: jnp.zeros_like(v) for k, v in arrays.items()}
    for k, g in seeds.items():
        grads[k] = grads[k] + g
    g_consts = jax.tree.map(jnp.zeros_like, inputs["consts"])

    def step(rows, width, d, state):
        grads, g_consts = state
        specs = grammar.views(d, rows, width, length)
        views = {k: _read(arrays[v.array], v) for k, v in specs.items()}
        writes = _writes(grammar, d, length, width)
        known = {name: _read_row(arrays[name], row, col, size) for name, (row, col, size) in writes.items()}
        g_out = {name: _read_row(grads[name], row, col, size) for name, (row, col, size) in writes.items()}
        sr_d = sr.for_diagonal(d)

        def recursion(views, consts):
            out, _ = grammar.step(sr_d, d, views, consts, known=known, exact=True, length=length)
            return {name: out[name] for name in writes}

        _, pullback = jax.vjp(recursion, views, inputs["consts"])
        g_views, g_c = pullback(g_out)
        # Materialise the adjoints before the in-place block updates (as in the inside
        # pass: fused into both updates, every share would be computed twice).
        g_views = lax.optimization_barrier(g_views)
        grads = dict(grads)
        for k, v in specs.items():
            grads[v.array] = _add_block(grads[v.array], g_views[k], v.row, v.col)
        return grads, jax.tree.map(jnp.add, g_consts, g_c)

    state = (grads, g_consts)
    for d0, d1 in reversed(problem.chunks):
        rows, width = grammar.block(d0, d1, length)
        body = functools.partial(step, rows, width)
        first = max(d0, grammar.first_diagonal)
        state = lax.fori_loop(0, max(d1 - first, 0), lambda t, s, body=body, d1=d1: body(d1 - 1 - t, s), state)
    grads, g_consts = state
    g_inputs = {"arrays": {k: grads[k] for k in inputs["arrays"]}, "consts": g_consts}
    g_charts = {k: grads[k] for k in charts}
    return g_inputs, g_charts


def _value(problem, sr, inputs, lengths):
    charts = fill(problem, sr, inputs)
    return problem.grammar.output(sr.for_output(), _arrays(inputs, charts), inputs["consts"], lengths,
                                  problem.length)


def _value_and_grad(problem, sr_in, sr_out, inputs, lengths, g_out):
    """(value [B], d value / d inputs) with output adjoints ``g_out`` [B] (an outside pass)."""
    grammar, length = problem.grammar, problem.length
    charts = fill(problem, sr_in, inputs)

    def output(inputs, charts):
        return grammar.output(sr_out.for_output(), _arrays(inputs, charts), inputs["consts"], lengths, length)

    value, pullback = jax.vjp(output, inputs, charts)
    g_direct, seeds = pullback(g_out.astype(value.dtype))
    g_inputs, g_charts = outside(problem, sr_out, inputs, charts, seeds)
    # The charts' initial values (e.g. the unpaired scores in row 0) come from the inputs.
    _, init_pullback = jax.vjp(lambda x: grammar.init_charts(x, length, problem.widest), inputs)
    (g_init,) = init_pullback(g_charts)
    return value, jax.tree.map(lambda *g: sum(g), g_inputs, g_direct, g_init)


# ------------------------------------------ vmap folded into the batch axis

def _fold_vmap(fn):
    """``fn(inputs, lengths, *rest)`` (leading batch axis everywhere) with ``jax.vmap``
    folded into that batch axis: a mapped call runs the engine's own batched program,
    and its ``lax.cond`` stays a cond instead of a select running both branches."""
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        in_batched = jax.tree.map(bool, in_batched)
        args = jax.tree.map(lambda a, b: a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a)),
                            args, tuple(in_batched))
        batch = jnp.shape(args[1])[1]  # lengths: [V, B]
        flat = jax.tree.map(lambda a: a.reshape((axis_size * batch,) + a.shape[2:]), args)
        out = wrapped(*flat)
        out = jax.tree.map(lambda a: a.reshape((axis_size, batch) + a.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


@functools.lru_cache(maxsize=512)
def _programs(problem: Problem, semiring_name: str):
    sr = {"log": LOG, "max": MAX}[semiring_name]

    @_fold_vmap
    def value_raw(inputs, lengths):
        return _value(problem, sr, inputs, lengths)

    def unfolded_grad(inputs, lengths):
        return _value_and_grad(problem, sr, sr, inputs, lengths, jnp.ones(lengths.shape))

    grad_raw = _fold_vmap(unfolded_grad)

    @_fold_vmap
    def hvp_raw(inputs, lengths, tangents):
        # Forward mode through the inside and outside loops: O(L^2) memory. (The jvp
        # runs inside the vmap rule: a jvp of a custom_vmap function cannot be vmapped.)
        return jax.jvp(lambda x: unfolded_grad(x, lengths)[1], (inputs,), (tangents,))[1]

    @jax.custom_jvp
    def value_and_grad(inputs, lengths):
        return grad_raw(inputs, lengths)

    def _value_and_grad_jvp(primals, tangents):
        inputs, lengths = primals
        dot = tangents[0]
        value, grads = grad_raw(inputs, lengths)
        value_dot = _vdot_batched(grads, dot)
        live = [t for t in _tangent_leaves(dot) if not _is_zero(t)]
        if sr is MAX or not live:  # the arg-max indicator is piecewise constant: zero derivative
            return (value, grads), (value_dot, jax.tree.map(jnp.zeros_like, grads))
        # Zero tangents (inputs not differentiated) become zeros that are still linear in a
        # live tangent: the transpose of the symmetric product needs every leaf linear.
        anchor = 0 * jnp.sum(live[0])
        dot = jax.tree.map(lambda t, x: jnp.broadcast_to(anchor, jnp.shape(x)).astype(x.dtype) if _is_zero(t) else t,
                           dot, inputs, is_leaf=_is_zero)
        return (value, grads), (value_dot, _symmetric_hvp(hvp_raw, inputs, lengths, dot))

    value_and_grad.defjvp(_value_and_grad_jvp, symbolic_zeros=True)

    @jax.custom_jvp
    def value(inputs, lengths):
        return value_raw(inputs, lengths)

    @value.defjvp
    def _value_jvp(primals, tangents):
        inputs, lengths = primals
        value_, grads = value_and_grad(inputs, lengths)
        return value_, _vdot_batched(grads, tangents[0])

    return value, value_and_grad


def _is_zero(t):
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


def _tangent_leaves(dot):
    return jax.tree.leaves(dot, is_leaf=_is_zero)


def _vdot_batched(grads, dot):
    """sum over everything but the batch axis of grads * dot -> [B] (zero tangents skipped)."""
    leaves = jax.tree.leaves(grads)
    terms = [jnp.sum((g * t).reshape(g.shape[0], -1), axis=1)
             for g, t in zip(leaves, _tangent_leaves(dot)) if not _is_zero(t)]
    return sum(terms) if terms else jnp.zeros(leaves[0].shape[:1], leaves[0].dtype)


@jax.custom_jvp
def _third_order_guard(x):
    return x


@_third_order_guard.defjvp
def _third_order_guard_jvp(primals, tangents):
    raise NotImplementedError(
        "foldax computes first and second derivatives of its DP (gradients, Hessian-vector products, "
        "gradients of pair_probs); third and higher derivatives are not supported")


def _symmetric_hvp(hvp_raw, inputs, lengths, dot):
    """H @ dot as a linear map whose transpose is itself (H = d^2 value / d inputs^2 is
    symmetric), so reverse mode over it (the gradient of anything built on pair_probs)
    costs one more forward-mode pass instead of an O(L^3) tape."""

    def matvec(x):
        # Only used by JAX to differentiate H itself (third order): refuse clearly.
        guarded = _third_order_guard(jax.tree.leaves(inputs)[0])
        return jax.tree.map(lambda a: a + 0 * jnp.sum(guarded).astype(a.dtype), x)

    def solve(_, b):
        return hvp_raw(inputs, lengths, b)

    return lax.custom_linear_solve(matvec, dot, solve, symmetric=True)


def value(problem: Problem, semiring: str, inputs, lengths):
    """The grammar's output (log Z or the best score) per sequence [B].

    Differentiable in ``inputs`` (a dict ``{"arrays": ..., "consts": ...}`` of float
    arrays with a leading batch axis) by forward mode, reverse mode (the outside pass)
    and forward-over-reverse or reverse-over-reverse (second derivatives, e.g. the
    gradient of a loss on pair probabilities); ``lengths`` [B] is an int input.
    """
    return _programs(problem, semiring)[0](inputs, lengths)


def value_and_grad(problem: Problem, semiring: str, inputs, lengths):
    """``(value [B], d value_b / d inputs_b)``: one inside and one outside pass."""
    return _programs(problem, semiring)[1](inputs, lengths)


def charts(problem: Problem, semiring: str, inputs):
    """The filled charts (a dict), e.g. for inspection in notebooks."""
    return fill(problem, {"log": LOG, "max": MAX}[semiring], inputs)


#: Samples per outside pass in :func:`sample_pairs` are grouped so that the tiled inputs,
#: charts and adjoints hold about this many elements (memory, not speed, sets the group).
SAMPLE_GROUP_ELEMENTS = 1 << 26


def sample_pairs(problem: Problem, key, inputs, lengths, num_samples: int, group: int | None = None):
    """``num_samples`` exact samples per sequence as 0/1 pair indicators [S, B, L(width), L(start)].

    One inside pass (log semiring); then per group of ``group`` samples (default: as many
    as fit in :data:`SAMPLE_GROUP_ELEMENTS`), an outside pass over the charts tiled
    ``group`` times with a :class:`SampleSemiring`: the adjoint (0 or 1) of the grammar's
    pair scores marks the sampled structure's pairs.
    """
    grammar, length = problem.grammar, problem.length
    charts = fill(problem, LOG, inputs)
    batch = lengths.shape[0]
    if group is None:
        per_sample = 2 * sum(int(np.prod(a.shape)) for a in jax.tree.leaves((inputs, charts)))  # + adjoints
        group = int(max(1, min(num_samples, SAMPLE_GROUP_ELEMENTS // max(1, per_sample))))

    def tile(a):
        return jnp.broadcast_to(a[None], (group,) + a.shape).reshape((group * a.shape[0],) + a.shape[1:])

    def one_group(group_key):
        sr = SampleSemiring(group_key)
        inputs_g, charts_g, lengths_g = jax.tree.map(tile, (inputs, charts, lengths))

        def output(inputs, charts):
            return grammar.output(sr.for_output(), _arrays(inputs, charts), inputs["consts"], lengths_g, length)

        value, pullback = jax.vjp(output, inputs_g, charts_g)
        g_direct, seeds = pullback(jnp.ones_like(value))
        g_inputs, _ = outside(problem, sr, inputs_g, charts_g, seeds)
        marks = grammar.pair_marks(g_inputs["arrays"]) + grammar.pair_marks(g_direct["arrays"])
        return marks.reshape((group, batch) + marks.shape[1:]) > 0.5

    num_groups = -(-num_samples // group)
    keys = jax.random.split(key, num_groups)
    marks = lax.map(one_group, keys)
    return marks.reshape((num_groups * group, batch) + marks.shape[3:])[:num_samples]
