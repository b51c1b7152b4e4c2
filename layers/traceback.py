"""Top-down traceback over finished charts: exact samples (and best structures) that visit only
the cells of the structure they draw, from the grammar's one recursion.

The outside pass (``chart.outside``) runs every diagonal's ``step`` under ``jax.vjp``: O(n^3)
work per sample. A sampled structure is a derivation tree, and each of its nodes is one chart
cell. So this module keeps, per sample, a stack of the cells still to expand, and expands one
cell at a time by running the grammar's own ``step`` for that cell alone (a diagonal one cell
wide, its views shifted to the cell's column) under ``jax.vjp``, with the cotangent one-hot on
the cell's output. In the sampling semiring that pullback is the cell's stochastic choice: its
non-zero view adjoints are the child cells (pushed) and, on the pair scores, the pair it makes
(recorded). In the max semiring it is the arg-max choice. The cost per sample is one cell step
per derivation node, O(n) nodes of O(n + 31^2) work each, instead of a full outside pass.

A cell's ``step`` reads its views exactly as the outside pass does (``rows`` as for the last
chunk; the charts are finished), so nothing grammar-specific is written twice. What a grammar
must allow (both grammars do; ``tests/test_traceback.py`` checks them against the outside
pass and exact enumeration):

* its ``step`` evaluated at width 1 with every view's column shifted by the cell's column ``t``
  gives cell ``(t, t + d)``'s values; per-diagonal outputs (a row written with an explicit size
  of 1, e.g. the exterior loop's ``F5``) are valid at ``t = 0``, and rows packed in segments
  name their segment stride with ``packed_stride(name, length)``;
* every chart row it writes sits at ``row = r0 + a d``, ``col = c0 + b d + t`` (``a`` in
  {-1, 0, 1}), so that a chart position names its cell;
* its ``output`` reads one chart cell per sequence (the root of the derivation);
* a cell's choice makes at most :data:`MAX_CHILDREN` (2) child cells.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from foldax.layers import chart
from foldax.layers.chart import LOG, MAX, Problem, SampleSemiring, _arrays, _writes, fill

#: Most child cells one cell's choice makes: both grammars make at most 2 (a split's two parts,
#: or a prefix and a stem), and the step finds them as the first and the last chosen view entry.
MAX_CHILDREN = 2
#: Stack fields: chart id, diagonal, column, position in the cell's written row.
_FIELDS = 4


def _write_geometry(grammar, length):
    """Per chart written by ``step``: (r0, a, c0, b, packed size or 0, segment stride or 0)."""
    at = {d: _writes(grammar, d, length, 1) for d in (0, 1, 2)}
    wide = _writes(grammar, 0, length, 2)
    out = {}
    for name, (r0, c0, size) in at[0].items():
        a, b = at[1][name][0] - r0, at[1][name][1] - c0
        if (at[2][name][0] - at[1][name][0], at[2][name][1] - at[1][name][1]) != (a, b) or a not in (-1, 0, 1):
            raise ValueError(f"chart {name!r}: its rows are not written at affine positions of the diagonal")
        packed = size if wide[name][2] == size else 0  # an explicit size (not the diagonal's width)
        if a == 0 and not (packed == 1 and b in (-1, 1)):
            raise ValueError(f"chart {name!r}: a row per diagonal must be one cell wide")
        stride = getattr(grammar, "packed_stride", lambda *_: None)(name, length) if packed > 1 else None
        out[name] = (r0, a, c0, b, packed, stride or 0)
    return out


def _cell_of(geometry, names, chart_id, row, col):
    """(diagonal, column, position in the row) of a chart position (vectorised over ids)."""
    table = np.array([geometry[n] for n in names], dtype=np.int64)
    r0, a, c0, b, packed, stride = (jnp.asarray(table[:, k], jnp.int32)[chart_id] for k in range(6))
    d = jnp.where(a != 0, (row - r0) * a, (col - c0) * b)
    p = col - c0 - b * d
    t = jnp.where(packed == 0, p, jnp.where(stride > 0, p % jnp.maximum(stride, 1), 0))
    return d, t, p - jnp.where(packed == 0, p, t)


def _padded_extents(problem, rows, arrays):
    """Each array padded (at the high end of its last two axes) so that no single-cell read of
    any diagonal and column is clamped: ``lax.dynamic_slice`` moves a start that runs past the
    end, which would read another cell's values."""
    grammar, length = problem.grammar, problem.length
    need = {k: list(v.shape[-2:]) for k, v in arrays.items()}

    def cover(name, row, col, nrows, ncols):
        need[name][0] = max(need[name][0], max(row, 0) + nrows)
        need[name][1] = max(need[name][1], col + ncols)

    for d in range(grammar.first_diagonal, length):
        specs = grammar.views(d, rows, 1, length)
        writes = _writes(grammar, d, length, 1)
        for t in {0, length - 1 - d}:
            for v in specs.values():
                cover(v.array, v.row, v.col + t, v.rows, v.cols)
            for name, (row, col, size) in writes.items():
                cover(name, row, col + t, 1, size)
    return {k: jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, need[k][0] - a.shape[-2]), (0, need[k][1] - a.shape[-1])],
                       constant_values=-jnp.inf) for k, a in arrays.items()}


def _lane_read(array, b, row, col, rows, cols):
    """``array[b : b + 1, ..., row : row + rows, col : col + cols]`` (starts clamped as the engine's)."""
    start = tuple(jnp.asarray(x, jnp.int32) for x in (b,) + (0,) * (array.ndim - 3) + (row, col))
    return lax.dynamic_slice(array, start, (1,) + array.shape[1:-2] + (rows, cols))


def _first_and_last(masks, starts):
    """``[first, last]`` position of the True entries of the masks laid end to end (mask ``k``
    from ``starts[k]``), -1 where there are fewer than 1 or 2: ``jnp.nonzero(..., size=2,
    fill_value=-1)`` when at most two are True, in one pass over the masks without joining them
    (nonzero's cumulative sum and scatter cost more than the rest of a traceback step)."""
    big = np.iinfo(np.int32).max
    first, last, count = [], [], []
    for mask, start in zip(masks, starts):
        index = jnp.arange(mask.size, dtype=jnp.int32).reshape(mask.shape) + int(start)
        first.append(jnp.min(jnp.where(mask, index, big)))
        last.append(jnp.max(jnp.where(mask, index, -1)))
        count.append(jnp.sum(mask, dtype=jnp.int32))
    first, last, count = jnp.min(jnp.stack(first)), jnp.max(jnp.stack(last)), jnp.sum(jnp.stack(count))
    return jnp.stack([jnp.where(count > 0, first, -1), jnp.where(count > 1, last, -1)])


def _clamped(start, dim, size):
    return jnp.clip(start, 0, dim - size)


@functools.partial(jax.jit, static_argnames=("problem", "semiring", "num_samples", "with_values"))
def traceback_tables(problem: Problem, semiring: str, key, inputs, lengths, num_samples: int = 1, *,
                     with_values: bool = False):
    """Pair tables ``[num_samples, B, L]`` (partner or -1) by top-down traceback (and, with
    ``with_values``, the output of the charts ``[B]``: log Z, or the best score).

    ``semiring="sample"``: exact, independent samples from the log semiring's charts (lane
    ``(s, b)`` draws from ``key`` folded with ``s`` and ``b``, so a sequence's samples do not
    depend on the rest of its batch). ``semiring="max"``: the best structure (``num_samples`` 1;
    ties as the max semiring's outside pass breaks them).
    """
    grammar, length = problem.grammar, problem.length
    sampling = semiring == "sample"
    if not sampling and num_samples != 1:
        raise ValueError("the max traceback gives one structure per sequence")
    fill_sr = LOG if sampling else MAX
    key = jax.random.key(0) if key is None else key  # unused by the max traceback
    charts = fill(problem, fill_sr, inputs)
    batch = lengths.shape[0]
    names = tuple(_writes(grammar, 0, length, 1))
    geometry = _write_geometry(grammar, length)

    # The root: the one chart cell that the output reads (its adjoint is 1).
    def output(charts):
        return grammar.output(fill_sr.for_output(), _arrays(inputs, charts), inputs["consts"], lengths, length)

    values, pullback = jax.vjp(output, charts)
    (seeds,) = pullback(jnp.ones((batch,), next(iter(charts.values())).dtype))
    # The seeds depend only on the lengths: with constant lengths XLA would constant-fold the
    # arg-max below over every chart cell (seconds of compile, and a slow-operation alarm).
    seeds = lax.optimization_barrier(seeds)
    flat = jnp.concatenate([seeds[n].reshape(batch, -1) for n in names], axis=1)
    where = jnp.argmax(flat, axis=1)
    sizes = np.array([int(np.prod(seeds[n].shape[1:])) for n in names])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    root_id = jnp.searchsorted(jnp.asarray(starts[1:]), where, side="right").astype(jnp.int32)
    local = where - jnp.asarray(starts)[root_id]
    cols = jnp.asarray(np.array([seeds[n].shape[-1] for n in names]))[root_id]
    root_d, root_t, root_p = _cell_of(geometry, names, root_id, (local // cols).astype(jnp.int32),
                                      (local % cols).astype(jnp.int32))
    root_live = (jnp.take_along_axis(flat, where[:, None], axis=1)[:, 0] > 0.5) & (root_d >= grammar.first_diagonal)

    rows = grammar.block(length - 1, length, length)[0]
    arrays = _padded_extents(problem, rows, _arrays(inputs, charts))
    input_names = set(inputs["arrays"])
    specs0 = grammar.views(grammar.first_diagonal, rows, 1, length)
    chart_views = [k for k, v in specs0.items() if v.array in geometry]
    view_chart = jnp.asarray([names.index(specs0[k].array) for k in chart_views], jnp.int32)
    view_sizes = np.array([specs0[k].rows * specs0[k].cols for k in chart_views])
    view_starts = np.concatenate([[0], np.cumsum(view_sizes)[:-1]])
    view_cols = jnp.asarray([specs0[k].cols for k in chart_views], jnp.int32)
    if any(arrays[specs0[k].array].ndim != 3 for k in chart_views):
        raise ValueError("charts read by the traceback must be [B, rows, cols]")
    depth = length + MAX_CHILDREN + 2  # pending cells are disjoint spans: at most L at once

    def lane_step(b, lane_key, it, stack, sp, table):
        active = sp > 0
        top = stack[jnp.maximum(sp - 1, 0)]
        chart_id, d, t, position = (top[k] for k in range(_FIELDS))
        d = jnp.where(active, d, grammar.first_diagonal)
        t = jnp.where(active, t, 0)
        sp = sp - active.astype(sp.dtype)
        specs = grammar.views(d, rows, 1, length)
        views = {k: _lane_read(arrays[v.array], b, v.row, v.col + t, v.rows, v.cols) for k, v in specs.items()}
        writes = _writes(grammar, d, length, 1)
        known = {n: _lane_read(arrays[n], b, row, col + t, 1, size)[..., 0, :] for n, (row, col, size) in writes.items()}
        consts = jax.tree.map(lambda c: lax.dynamic_slice_in_dim(c, b, 1, 0), inputs["consts"])

        def recursion(views, sr):
            out, _ = grammar.step(sr, d, views, consts, known=known, exact=True, length=length)
            return {n: out[n] for n in writes}

        if sampling:
            # The step's uniforms in one draw (one jax.random loop per step, not three per sum):
            # an abstract first trace (no operations in the program) counts them.
            counter = SampleSemiring(None)
            jax.eval_shape(lambda v: recursion(v, counter), views)
            dtype = next(iter(views.values())).dtype
            sr = SampleSemiring(None, uniforms=jax.random.uniform(jax.random.fold_in(lane_key, it),
                                                                  (counter.uniforms_used,), dtype))
        else:
            sr = MAX
        recursion = functools.partial(recursion, sr=sr)
        out, pullback = jax.vjp(recursion, views)
        g_out = {n: jnp.where(active & (chart_id == k), jax.nn.one_hot(position, out[n].shape[-1], dtype=out[n].dtype),
                              0)[None] for k, n in enumerate(names)}
        (g_views,) = pullback(g_out)

        pair_g = grammar.pair_marks({v.array: g_views[k] for k, v in specs.items()
                                     if v.array in input_names and v.rows == 1 and v.cols == 1})
        paired = pair_g.reshape(()) > 0.5
        table = table.at[jnp.where(paired, t, length)].set(t + d, mode="drop")
        table = table.at[jnp.where(paired, t + d, length)].set(t, mode="drop")

        pos = _first_and_last([g_views[k] > 0.5 for k in chart_views], view_starts)
        v_idx = jnp.clip(jnp.searchsorted(jnp.asarray(view_starts[1:]), pos, side="right", method="compare_all"),
                         0, len(chart_views) - 1)
        offset = pos - jnp.asarray(view_starts)[v_idx]
        start_row = jnp.stack([_clamped(specs[k].row, arrays[specs[k].array].shape[-2], specs[k].rows)
                               for k in chart_views])[v_idx]
        start_col = jnp.stack([_clamped(specs[k].col + t, arrays[specs[k].array].shape[-1], specs[k].cols)
                               for k in chart_views])[v_idx]
        child_id = view_chart[v_idx]
        child_d, child_t, child_p = _cell_of(geometry, names, child_id, start_row + offset // view_cols[v_idx],
                                             start_col + offset % view_cols[v_idx])
        live = ((pos >= 0) & (child_d >= grammar.first_diagonal) & (child_d < length) & (child_t >= 0)
                & (child_t + child_d < length))
        for c in range(MAX_CHILDREN):
            item = jnp.stack([child_id[c], child_d[c], child_t[c], child_p[c]]).astype(stack.dtype)
            stack = stack.at[sp].set(jnp.where(live[c], item, stack[sp]))
            sp = sp + live[c].astype(sp.dtype)
        return stack, sp, table

    step = jax.vmap(lane_step, in_axes=(0, 0, None, 0, 0, 0))
    root = jnp.stack([root_id, root_d, root_t, root_p], axis=1).astype(jnp.int32)

    def one_group(samples):
        """Tables [len(samples), B, L]: every (sample, sequence) a lane of one while loop."""
        lane_s = jnp.repeat(samples, batch)
        lane_b = jnp.tile(jnp.arange(batch, dtype=jnp.int32), samples.shape[0])
        lane_keys = jax.vmap(lambda s, b: jax.random.fold_in(jax.random.fold_in(key, s), b))(lane_s, lane_b)
        stack = jnp.zeros((lane_b.shape[0], depth, _FIELDS), jnp.int32).at[:, 0].set(root[lane_b])
        sp = root_live[lane_b].astype(jnp.int32)
        table = jnp.full((lane_b.shape[0], length), -1, jnp.int32)

        def cond(state):
            # Ends: every child lies on a smaller diagonal than its parent (the step reads only
            # finished diagonals), so each lane's stack empties.
            return jnp.any(state[2] > 0)

        def body(state):
            it, stack, sp, table = state
            return (it + 1,) + step(lane_b, lane_keys, it, stack, sp, table)

        _, _, _, table = lax.while_loop(cond, body, (jnp.int32(0), stack, sp, table))
        return table.reshape(samples.shape[0], batch, length)

    # Lanes in groups whose per-step reads (views, their adjoints, the stacks) stay within the
    # sampler's memory cap; a sample's draws depend on its index, not on its group.
    per_lane = 2 * sum(v.rows * v.cols for v in specs0.values()) + depth * _FIELDS + length
    group = int(max(1, min(num_samples, chart.SAMPLE_GROUP_ELEMENTS // max(1, per_lane * batch))))
    num_groups = -(-num_samples // group)
    samples = jnp.arange(num_groups * group, dtype=jnp.int32).reshape(num_groups, group)
    tables = lax.map(one_group, samples)
    tables = tables.reshape((num_groups * group, batch, length))[:num_samples]
    return (tables, values) if with_values else tables


@functools.lru_cache(maxsize=256)
def _best_program(problem: Problem):
    @chart._fold_vmap
    def best(inputs, lengths):
        tables, values = traceback_tables(problem, "max", None, inputs, lengths, with_values=True)
        return tables[0], values

    return best


def best_tables(problem: Problem, inputs, lengths):
    """``(pair tables [B, L], best scores [B])`` by the max traceback; ``jax.vmap`` of it is
    folded into the batch axis (one traceback over all the mapped sequences, as the engine's
    value programs do), not a mapped loop."""
    return _best_program(problem)(inputs, lengths)
