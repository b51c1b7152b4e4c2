r"""The Turner 2004 nearest-neighbour grammar (ViennaRNA 2.x's default model) on the chart engine.

A structure's log-weight is ``-E(s)/kT`` (kcal/mol, 37 C; ``E`` the sum of its loop energies
with dangles=2, see ``layers/energy_params.py``) plus ``phi[i, j]`` for each pair. The
recursion (log semiring shown; ``(+)`` is ``plus``/``sum`` of the semiring, ``w(...)`` a loop's
log-weight; spans are 0-based and inclusive)::

    QB[i][j]   = pair[i,j] + ( w_hairpin(i,j) (+) QI[i][j] (+) w_mlclose(i,j) + QMM[i+1][j-1] )
    QI[i][j]   = SUM_{(k,l) inside, l1 = k-i-1, l2 = j-l-1, 0 < l1+l2+... <= 30} w_interior(i,j,k,l) + QB[k][l]
    QM1[i][j]  = ( QM1[i][j-1] + b ) (+) ( QB[i][j] + w_stem(i,j) )        one stem starting at i
    QM1x[i][j] = QM1[i][j] (+) ( QM1x[i+1][j] + b )                        one stem, unpaired before it
    QMM[i][j]  = SUM_{u=i+1}^{j} QM[i][u-1] + QM1[u][j]                     >= 2 stems
    QM[i][j]   = QM1x[i][j] (+) QMM[i][j]                                   >= 1 stem
    F5[j]      = F5[j-1] (+) SUM_k F5[k-1] + QB[k][j] + w_ext(k,j);  log Z = F5[n-1]

with ``b`` the multiloop's per-unpaired log-weight. It is unambiguous (each structure has one
derivation), so ``log Z`` is the log of ViennaRNA's partition function and the max semiring gives
its minimum free energy. Splitting ``QM`` into one stem (``QM1x``, an O(1) recursion) and two or
more (``QMM``) leaves a single O(n^3) split sum, ``QMM``, which also closes multiloops.

Without lonely pairs (``TurnerGrammar.no_lonely_pairs``, RNAfold's ``--noLP``) every read of
``QB`` except the stack's becomes ``QS[i][j] = pair[i,j] + w_stack(i,j) + QB[i+1][j-1]``: a pair
that its enclosing loop does not stack on must stack on its inner pair.

Interior loops (all ~500 ``(l1, l2)`` with ``l1 + l2 <= 30``). The loop's energy is a
per-(l1, l2) length term plus a mismatch of the outer pair (depends on (i, j)) plus one of the
inner pair (depends on (k, l)), except for the tabulated small loops (stack, 1-nt bulges, 1x1,
1x2, 2x1, 2x2), whose scores are per-cell arrays. For a fixed ``l1``, the inner pairs of all
cells on diagonal d sit in one column-shifted block of the last 31 diagonals of ``QB``
(a *window* of the start-indexed chart); for a fixed ``l2`` they sit in a block of the end-indexed
copy of ``QB``. Per loop class the sum over the loop lengths is a semiring matrix product of a
[rows, 31] table of length terms with the window, and the shifted rows are gathered by a reshape.
In the log semiring's outside pass the rows of every class stay in linear space, each with its log
scale, and are summed together: one exp per row and cell, one log per cell and no exp in the
transpose (``_sum_linear_rows``; the same values as the inside pass's per-row logs).

Large hairpins (> 30 nt): the partition function extrapolates ``hairpin[30] + lxc ln(u/30)``
exactly, ViennaRNA's energy evaluation and MFE truncate it to 0.01 kcal/mol; the max semiring
uses the truncated form so that ``max_score`` is ViennaRNA's MFE. (Likewise the 2x3 loops' ninio
term is capped in the partition function only.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers.alphabet import NUM_TOKENS
from foldax.layers.chart import View
from foldax.layers.energy_params import MAX_LOOP, PAIR_INDEX, temperature_kt
from foldax.layers.stacking import lookup, shear, skew

N_TOKEN = NUM_TOKENS - 1
#: Rows of the interior-loop window: inner pairs are 2..32 diagonals back.
WINDOW = MAX_LOOP + 1
#: Start-indexed QB chart rows are offset by this much, so the window never starts below row 0.
ROW_PAD = WINDOW + 1

#: Per-cell score arrays that the recursion reads on the cell's own diagonal, stacked in one
#: array. The pair scores are an array of their own: pair probabilities need only their adjoint,
#: and XLA drops an unused adjoint only when it is a whole array (1.05x at 1,000 nt).
CELL_ARRAYS = ("hairpin", "stack", "bulge1_5", "bulge1_3", "int11", "int12", "int21", "int22",
               "outer_generic", "outer_1n", "outer_23", "outer_bulge", "ml_close", "ml_stem", "ext")
#: The multiloop charts packed into one (see TurnerGrammar.init_charts); without lonely pairs
#: the pairs' full chart ``QB`` rides along (the stacks read it two diagonals back).
ML_SEGMENTS = ("QI", "QM1", "QM1x", "QMM")
#: Inner-pair arrays read through the start-indexed window (one per loop class) ...
START_INNER = ("inner_generic", "inner_23", "inner_1n", "inner_bulge")
#: ... and through the end-indexed window (the classes whose l2 is fixed).
END_INNER = ("inner_1n_r", "inner_bulge_r")


# ------------------------------------------------------------------ loop-length tables

def _loop_classes():
    """Static (l1, l2) bookkeeping: which loops each class sums, as window coordinates.

    Returns a dict class -> (rows of (l1 or l2) values, window shift per row, [(row, rho, l1, l2)]).
    ``rho = 30 - (l1 + l2)`` is the window row of the inner pair (width d - 2 - l1 - l2).
    """
    generic, pairs23, one_n, bulge = [], [], [], []
    for l1 in range(MAX_LOOP + 1):
        for l2 in range(MAX_LOOP + 1 - l1):
            small, large = min(l1, l2), max(l1, l2)
            if small >= 2 and (small, large) not in ((2, 2), (2, 3)):
                generic.append((l1, l2))
            elif (small, large) == (2, 3):
                pairs23.append((l1, l2))
            elif small == 1 and large >= 3:
                one_n.append((l1, l2))
            elif small == 0 and large >= 2:
                bulge.append((l1, l2))
    return {"generic": generic, "23": pairs23, "1n": one_n, "bulge": bulge}


LOOP_CLASSES = _loop_classes()
#: (class, side, fixed value) for each block: side "start" fixes l1 (start-indexed window),
#: "end" fixes l2 (end-indexed window). Each block is one row of a class's length table.
BLOCKS = {
    "generic": ("start", tuple(range(2, MAX_LOOP - 1))),
    "23": ("start", (2, 3)),
    "1n_start": ("start", (1,)),
    "bulge_start": ("start", (0,)),
    "1n_end": ("end", (1,)),
    "bulge_end": ("end", (0,)),
}


@functools.lru_cache(maxsize=None)
def _length_table_layout():
    """Static index arrays of the length tables: per block, [rows, 31] arrays of
    (class code, l1, l2) with class -1 where the window row holds no loop of the block."""
    codes = {"generic": 0, "23": 1, "1n": 2, "bulge": 3}
    layout = {}
    for name, (side, fixed) in BLOCKS.items():
        cls = name.split("_")[0]
        members = set(LOOP_CLASSES[cls])
        code = np.full((len(fixed), WINDOW), -1)
        l1s, l2s = np.zeros_like(code), np.zeros_like(code)
        for r, f in enumerate(fixed):
            for rho in range(WINDOW):
                # Window rows run by width: the start window upwards, the end window downwards.
                u = MAX_LOOP - rho if side == "start" else rho
                l1, l2 = (f, u - f) if side == "start" else (u - f, f)
                if l1 >= 0 and l2 >= 0 and (l1, l2) in members:
                    code[r, rho], l1s[r, rho], l2s[r, rho] = codes[cls], l1, l2
        layout[name] = (code, l1s, l2s)
    return layout


def _length_tables(params, *, pf: bool, batch: int, dtype):
    """Log-weights of the length-dependent part of each loop class, as [B, rows, 31] tables
    indexed by the fixed loop side (row) and the window row (30 - (l1 + l2) in the start
    window, l1 + l2 in the end window); -inf where a block has no loop."""
    interior = params["interior"].astype(dtype)
    bulge = params["bulge"].astype(dtype)
    ninio, max_ninio = params["ninio"].astype(dtype), params["max_ninio"].astype(dtype)
    tables = {}
    for name, (code, l1, l2) in _length_table_layout().items():
        small, large = np.minimum(l1, l2), np.maximum(l1, l2)
        asym = jnp.minimum(max_ninio, (large - small) * ninio)
        by_class = [
            interior[l1 + l2] + asym,  # generic
            interior[5] + (jnp.minimum(max_ninio, ninio) if pf else ninio),  # 2x3: eval does not cap it
            interior[np.minimum(large + 1, MAX_LOOP)] + jnp.minimum(max_ninio, (large - 1) * ninio),  # 1xn
            bulge[large],  # bulges of >= 2 nt (their terminal AU: the outer/inner arrays)
        ]
        energy = jnp.select([code == c for c in range(4)], [jnp.broadcast_to(e, code.shape) for e in by_class],
                            jnp.inf)
        table = jnp.where(code >= 0, -energy / temperature_kt(params), -jnp.inf)
        tables[name] = jnp.broadcast_to(table.astype(dtype), (batch,) + code.shape)
    return tables


# ----------------------------------------------------------------------- cell scores

def _table(params, name, dtype):
    return params[name].astype(dtype)


def _pair_type(a, b):
    return jnp.asarray(PAIR_INDEX).reshape(-1)[a * NUM_TOKENS + b]


def _au(params, t, dtype):
    """Terminal AU/GU penalty (kcal/mol) of pair type t (types GU UG AU UA = 2..5)."""
    return jnp.where(t >= 2, params["terminal_au"].astype(dtype), jnp.zeros((), dtype))


def _mismatch(params, name, t, a, b, dtype):
    return lookup(_table(params, name, dtype), (jnp.maximum(t, 0), a, b))


def _with_special_hairpins(params, x, energy, dtype):
    """Replaces the hairpin energy [B, L(d), L(i)] by the special loop's total energy where
    x[i..i+d] is a tri-, tetra- or hexaloop of the table (rows d = 4, 5, 7 only)."""
    batch, length = x.shape
    padded = jnp.concatenate([x, jnp.full((batch, 8), N_TOKEN, x.dtype)], axis=1).astype(jnp.int32)
    by_size = {}
    for seq, value in sorted(params["special_hairpins"].items()):
        by_size.setdefault(len(seq), []).append((seq, value))
    for size, entries in sorted(by_size.items()):
        if size - 1 >= length:
            continue
        # Base-5 code of x[i .. i+size-1] (N = 4 never matches a key over ACGU).
        code = sum(padded[:, t : t + length] * 5**t for t in range(size))
        keys = np.array([sum("ACGU".index(c) * 5**t for t, c in enumerate(seq)) for seq, _ in entries])
        values = jnp.stack([jnp.asarray(v, dtype) for _, v in entries])
        match = code[:, :, None] == keys  # [B, L, K]: at most one key per position
        special = jnp.sum(jnp.where(match, values, jnp.zeros((), dtype)), axis=-1)
        row = energy[:, size - 1]
        energy = energy.at[:, size - 1].set(jnp.where(jnp.any(match, axis=-1), special, row))
    return energy


def cell_scores(params, tokens, lengths, phi=None, *, min_hairpin=3, pf=True, end_pad=0):
    """The Turner grammar's engine inputs (log-weights ``-E/kT``; see the module docstring).

    ``pf=False`` gives the minimum-free-energy variant (large hairpins truncated like
    ViennaRNA's integer energies, 2x3 ninio uncapped). ``end_pad``: extra columns of the
    end-indexed arrays (the widest chunk of the engine's geometry, see ``TurnerGrammar``).
    """
    batch, length = tokens.shape
    dtype = jnp.result_type(*jax.tree.leaves(params))
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.float32
    x = jnp.clip(tokens, 0, N_TOKEN)
    # Positions past a sequence's length read as N (they never pair: see `pair` below).
    x = jnp.where(jnp.arange(length)[None, :] < lengths[:, None], x, N_TOKEN)
    shape = (batch, length, length)
    pad = 4
    row = jnp.concatenate([jnp.full((batch, pad), N_TOKEN, x.dtype), x,
                           jnp.full((batch, 2 * length + pad), N_TOKEN, x.dtype)], axis=1)

    def at_i(offset):  # x[i + offset] at cell (d, i)
        return jnp.broadcast_to(row[:, None, pad + offset : pad + offset + length], shape)

    def at_j(offset):  # x[i + d + offset] at cell (d, i)
        return shear(row[:, pad + offset : pad + offset + 2 * length], length)

    d = jnp.arange(length)[None, :, None]
    i = jnp.arange(length)[None, None, :]
    j = i + d
    n = lengths[:, None, None]
    xi, xj = at_i(0), at_j(0)
    t = _pair_type(xi, xj)
    t_safe = jnp.maximum(t, 0)
    neg_inf = jnp.array(-jnp.inf, dtype)

    kT = temperature_kt(params)

    def w(energy):
        return -energy / kT

    # A pair: canonical, long enough, inside the sequence; phi adds to its log-weight.
    can_pair = (t >= 0) & (d > min_hairpin) & (j < n)
    pair = jnp.where(can_pair, jnp.zeros((), dtype), neg_inf)
    if phi is not None:
        pair = pair + skew(phi.astype(dtype), length)

    # Hairpin loop of u = d - 1 unpaired bases.
    u = jnp.maximum(d - 1, 0)
    hp_table = _table(params, "hairpin", dtype)
    short = hp_table[jnp.minimum(u, MAX_LOOP)]
    ext = params["lxc"].astype(dtype) * jnp.log(jnp.maximum(u, 1).astype(dtype) / MAX_LOOP)
    if not pf:
        ext = jnp.trunc(ext * 100) / 100  # ViennaRNA's integer dcal: (int)(lxc * ln(u/30))
    length_term = jnp.where(u <= MAX_LOOP, short, hp_table[MAX_LOOP] + ext)
    general = jnp.where(u == 3, length_term + _au(params, t, dtype),
                        length_term + _mismatch(params, "mismatch_hairpin", t, at_i(1), at_j(-1), dtype))
    general = jnp.where(u < 3, length_term, general)
    hairpin = w(_with_special_hairpins(params, x, general, dtype))

    def inner_type(k_off, l_off):  # type of the inner pair read from inside: t(x_l, x_k)
        return jnp.maximum(_pair_type(at_j(l_off), at_i(k_off)), 0)

    stack_table = _table(params, "stack", dtype)
    stack = w(lookup(stack_table, (t_safe, inner_type(1, -1))))
    bulge1 = params["bulge"].astype(dtype)[1]
    bulge1_5 = w(bulge1 + lookup(stack_table, (t_safe, inner_type(2, -1))))  # l1 = 1, l2 = 0
    bulge1_3 = w(bulge1 + lookup(stack_table, (t_safe, inner_type(1, -2))))  # l1 = 0, l2 = 1
    int11 = w(lookup(_table(params, "int11", dtype), (t_safe, inner_type(2, -2), at_i(1), at_j(-1))))
    # 1x2 (l1 = 1, l2 = 2): int21[T, T', x[i+1], x[l+1], x[j-1]] with l = j - 3.
    int12 = w(lookup(_table(params, "int21", dtype),
                     (t_safe, inner_type(2, -3), at_i(1), at_j(-2), at_j(-1))))
    # 2x1 (l1 = 2, l2 = 1): int21[T', T, x[l+1], x[i+1], x[k-1]] with k = i + 3, l = j - 2.
    int21 = w(lookup(_table(params, "int21", dtype),
                     (inner_type(3, -2), t_safe, at_j(-1), at_i(1), at_i(2))))
    int22 = w(lookup(_table(params, "int22", dtype),
                     (t_safe, inner_type(3, -3), at_i(1), at_i(2), at_j(-2), at_j(-1))))
    outer = {
        "outer_generic": w(_mismatch(params, "mismatch_interior", t, at_i(1), at_j(-1), dtype)),
        "outer_1n": w(_mismatch(params, "mismatch_interior_1n", t, at_i(1), at_j(-1), dtype)),
        "outer_23": w(_mismatch(params, "mismatch_interior_23", t, at_i(1), at_j(-1), dtype)),
        "outer_bulge": w(_au(params, t, dtype)),
    }
    # As an inner pair (k, l) = (i, j), read from inside the enclosing loop: t(x_j, x_i).
    t_rev = jnp.maximum(_pair_type(xj, xi), 0)
    inner = {
        "generic": w(_mismatch(params, "mismatch_interior", t_rev, at_j(1), at_i(-1), dtype)),
        "23": w(_mismatch(params, "mismatch_interior_23", t_rev, at_j(1), at_i(-1), dtype)),
        "1n": w(_mismatch(params, "mismatch_interior_1n", t_rev, at_j(1), at_i(-1), dtype)),
        "bulge": w(_au(params, t_rev, dtype)),
    }
    ml_intern = params["ml_intern"].astype(dtype)
    ml_close = w(params["ml_closing"].astype(dtype) + ml_intern + _au(params, t_rev, dtype)
                 + _mismatch(params, "mismatch_multi", t_rev, at_j(-1), at_i(1), dtype))
    ml_stem = w(ml_intern + _au(params, t, dtype)
                + _mismatch(params, "mismatch_multi", t, at_i(-1), at_j(1), dtype))
    # Exterior stems: dangles on the sides that have a neighbour.
    has5, has3 = i > 0, j < n - 1
    ext_energy = _au(params, t, dtype) + jnp.where(
        has5 & has3, _mismatch(params, "mismatch_exterior", t, at_i(-1), at_j(1), dtype),
        jnp.where(has5, lookup(_table(params, "dangle5", dtype), (t_safe, at_i(-1))),
                  jnp.where(has3, lookup(_table(params, "dangle3", dtype), (t_safe, at_j(1))),
                            jnp.zeros((), dtype))))

    per_cell = {"pair": pair, "hairpin": hairpin, "stack": stack, "bulge1_5": bulge1_5, "bulge1_3": bulge1_3,
                "int11": int11, "int12": int12, "int21": int21, "int22": int22, **outer,
                "ml_close": ml_close, "ml_stem": ml_stem, "ext": w(ext_energy)}
    # Stacked on an axis, so that a diagonal reads all its cells' scores with one slice;
    # the exterior-loop stems once more by span end (a column per end position, as in QBr).
    arrays = {"cells": jnp.stack([per_cell[k] for k in CELL_ARRAYS], axis=1),  # [B, field, L(d), L(i)]
              "pair": pair,
              "ext_r": _to_end_layout(per_cell["ext"], length, end_pad)}
    # Inner-pair arrays in the QB charts' coordinates (see TurnerGrammar.init_charts).
    # The log semiring sums loop lengths as matrix products in linear space (see _loop_sums).
    space = jnp.exp if pf else (lambda v: v)
    for name in ("generic", "23", "1n", "bulge"):
        arrays[f"inner_{name}"] = _to_start_layout(space(inner[name]), length)
    for name in ("1n", "bulge"):
        arrays[f"inner_{name}_r"] = _to_end_layout(space(inner[name]), length, end_pad)
    consts = {"ml_base": jnp.broadcast_to(w(params["ml_base"].astype(dtype)), (batch,)),
              **{f"len_{k}": v for k, v in _length_tables(params, pf=pf, batch=batch, dtype=dtype).items()}}
    return {"arrays": arrays, "consts": consts}


def _to_start_layout(cells, length):
    """[B, L(w), L(i)] -> the start-indexed window layout [B, L + ROW_PAD, L + WINDOW] (row w + ROW_PAD)."""
    return jnp.pad(cells, ((0, 0), (ROW_PAD, 0), (0, WINDOW)))


def _end_reverse(cells, length):
    """[B, L(w), L(i)] -> [B, L(w), L(j)] with the cell (j - w, j) at [w, j] (0 where j < w).

    Rows shifted right by w with a reshape: read with row stride 2L - 1, the flattened
    [w, 2L] array's row w starts w elements earlier.
    """
    batch = cells.shape[0]
    flat = jnp.pad(cells, ((0, 0), (0, 0), (0, length))).reshape(batch, 2 * length * length)
    rows = flat[:, : length * (2 * length - 1)].reshape(batch, length, 2 * length - 1)
    return rows[:, :, :length]


def _to_end_layout(cells, length, end_pad):
    """[B, L(w), L(i)] -> the end-indexed layout [B, L + 1 + max(ROW_PAD, end_pad), L + WINDOW + end_pad]:
    the cell (j - w, j) at row L - w, column j + WINDOW (the layout of the end-indexed QB chart)."""
    flipped = _end_reverse(cells, length)[:, ::-1]  # row L - 1 - w
    return jnp.pad(flipped, ((0, 0), (1, max(ROW_PAD, end_pad)), (WINDOW, end_pad)))


# ------------------------------------------------------------------------ grammar

def _shifted_rows(values, first_shift, width):
    """values [B, R, K] -> [B, R, width] with row r read from column first_shift + r.

    A pad and reshape instead of R slices or a gather: row r of the flattened [R, K + 1]
    array starts r elements later, so its transpose (the gradient) is a reshape too (a
    gather's transpose is a slow scatter-add on CPU).
    """
    batch, rows, cols = values.shape
    if rows == 1:
        return values[:, :, first_shift : first_shift + width]
    values = jax.lax.optimization_barrier(values)
    flat = jnp.pad(values, ((0, 0), (0, 0), (0, 1))).reshape(batch, rows * (cols + 1))
    flat = jnp.pad(flat, ((0, 0), (0, rows)))
    # Materialised on both sides, in both passes: the transpose's index arithmetic fused
    # with its neighbours' was ~30x slower than this plain copy (measured).
    return jax.lax.optimization_barrier(flat.reshape(batch, rows, cols + 2)[:, :, first_shift : first_shift + width])


@jax.custom_jvp
def _log_or_neg_inf(s):
    """log(s) for s >= 0 (log 0 = -inf) whose derivative is 0, not NaN, at s = 0.

    Its second derivative divides by ``s**2``: a sum that is differentiated twice (the
    outside pass's, under a Hessian-vector product) is normalised first (:func:`_sum_linear_rows`);
    the inside pass's per-row logs are differentiated once only."""
    return jnp.log(s)


@_log_or_neg_inf.defjvp
def _log_or_neg_inf_jvp(primals, tangents):
    (s,), (s_dot,) = primals, tangents
    positive = s > 0
    # The value through this same rule: differentiated again (second derivatives), the
    # derivative of log at 0 would make 0/0.
    return _log_or_neg_inf(s), jnp.where(positive, s_dot / jnp.where(positive, s, 1), 0)


def _linear_window(qb):
    """The window in linear space, each column shifted by its maximum: ``(exp(qb - top), top)``.
    Shared by every loop class that reads this window."""
    top = jax.lax.stop_gradient(_finite_or_zero(jnp.max(qb, axis=1, keepdims=True)))
    return jnp.exp(qb - top), top


def _linear_loop_rows(lengths_table, inner, linear, first_shift, width):
    """The log semiring's loop-length sums of one block, left in linear space:
    ``(values [B, R, width], log_scale [B, R, width])`` with row r's sum at cell i equal to
    ``values * exp(log_scale)`` (the sum :func:`_loop_sums` takes the log of).

    ``linear`` is :func:`_linear_window` of the block's window. Both factors of the matrix
    product are shifted by their maxima (rows of the length table, columns of the window),
    so nothing overflows; the shifts come back as ``log_scale``. A term underflows only if it
    is ~87 (float32) or ~700 (float64) nats below the largest one of its length-table row:
    loop-length tables that spread over less than ~50 kcal/mol (float32) are summed exactly.
    """
    window, b_top = linear
    a_top = jax.lax.stop_gradient(_finite_or_zero(jnp.max(lengths_table, axis=2, keepdims=True)))
    total = jnp.einsum("brw,bwk->brk", jnp.exp(lengths_table - a_top), window * inner,
                       precision=jax.lax.Precision.HIGHEST)
    rows = total.shape[1]
    b_top = _shifted_rows(jnp.broadcast_to(b_top, (b_top.shape[0], rows, b_top.shape[2])), first_shift, width)
    return _shifted_rows(total, first_shift, width), a_top + b_top


def _sum_linear_rows(blocks):
    """``log SUM_blocks SUM_r values[:, r] * exp(log_scale[:, r])`` -> [B, width] for ``blocks`` a
    list of ``(values, log_scale)`` ([B, R, width] each), in one exp pass (not concatenated: a
    copy of every row).

    Shifted by the largest scale of each cell, so nothing overflows. A row underflows only
    when its scale is ~87 (float32) nats below that largest one; it is then negligible unless
    the largest-scale row's own value is nearly as far below its scale, which takes loop
    tables that spread over more than ~50 kcal/mol: the envelope of :func:`_linear_loop_rows`.

    The total itself may still be tiny (every row's value ~e^-60 when the window's column
    maxima lie at widths none of the rows can use). Its log is taken of ``total / c`` with
    ``c`` its own (constant) magnitude, so that second derivatives never square the total
    (``1 / total^2`` overflows float32 there: NaN in the gradient of ``pair_probs``)."""
    top = functools.reduce(jnp.maximum, [jnp.max(log_scale, axis=1) for _, log_scale in blocks])
    top = jax.lax.stop_gradient(_finite_or_zero(top))
    total = sum(jnp.sum(values * jnp.exp(log_scale - top[:, None]), axis=1) for values, log_scale in blocks)
    # Floored so that 1 / c stays finite (c >= ~1e-31 in float32), and total / c >= ~1e-14.
    magnitude = jax.lax.stop_gradient(jnp.maximum(total, jnp.finfo(total.dtype).tiny ** 0.8))
    return _log_or_neg_inf(total / magnitude) + (jnp.log(magnitude) + top)


def _loop_sums(sr, lengths_table, qb, inner, linear, first_shift, width):
    """``V[r, i] = (+)_rho len[r, rho] + qb[rho, c] + inner[rho, c]`` at ``c = i + first_shift + r``
    -> [B, R, width] (row r of a block sums the loops whose inner pair starts at that column).

    ``inner`` is in linear space (``exp`` of the log-weights: the inputs of the log
    semiring, also used by the sampling semiring) or in log space (the max semiring's). In
    the log semiring the sum over the window rows is :func:`_linear_loop_rows` (one BLAS
    call; ``linear`` is the shared :func:`_linear_window` of ``qb``), logged per row. Other
    semirings sum the [R, rho, K] terms explicitly.
    """
    if sr.name == "log":
        values, log_scale = _linear_loop_rows(lengths_table, inner, linear if linear is not None else
                                              _linear_window(qb), first_shift, width)
        # Shifted before the log: only the cells' own columns are logged.
        return _log_or_neg_inf(values) + log_scale
    if sr.name == "sample":
        inner = jnp.log(inner)
    if width == 1:
        # One cell (the traceback): row r's terms are column first_shift + r of the window.
        rows = lengths_table.shape[1]
        window = (qb + inner)[:, :, first_shift : first_shift + rows]  # [B, rho, R]
        return sr.sum(lengths_table + jnp.swapaxes(window, 1, 2), axis=2)[:, :, None]
    return _shifted_rows(sr.matmul(lengths_table, qb + inner), first_shift, width)


def _unpack_ml(row, names, length, width):
    """A packed ML row [B, len(names) (L + 1)] -> the known totals of its charts on this diagonal."""
    segments = row.reshape(row.shape[0], len(names), length + 1)[:, :, :width]
    return {name: segments[:, k] for k, name in enumerate(names)}


def _finite_or_zero(x):
    return jnp.where(jnp.isfinite(x), x, jnp.zeros_like(x))


@dataclasses.dataclass(frozen=True)
class TurnerGrammar:
    """The Turner 2004 recursion for the chart engine (see the module docstring).

    ``no_lonely_pairs``: only structures in which every pair stacks on a neighbouring pair
    (RNAfold's ``--noLP``; helices of one pair excluded). A pair that the enclosing loop does
    not stack on must then stack on its inner pair: every loop except the stack reads the
    stacked-inside chart ``QS[i][j] = pair + stack(i, j) + QB[i+1][j-1]`` where it reads
    ``QB`` otherwise (the interior-loop windows, multiloop branches, exterior stems), and
    the stack reads the full ``QB``. Still one derivation per structure.
    """

    min_hairpin: int = 3
    no_lonely_pairs: bool = False
    first_diagonal = 1
    one_pass = False
    cell_cost = 160  # the interior loops' fixed work per cell, in split-term units
    # Each chunk is a fill and an outside loop body: ~3.5 s of XLA compile on 2 cores. 8 chunks
    # instead of 16 halve the compile (~25 s at any length) for ~10% more run time at 1,000 nt.
    max_auto_chunks = 8

    @property
    def ml_segments(self):
        return ML_SEGMENTS + ("QB",) if self.no_lonely_pairs else ML_SEGMENTS

    @property
    def row_offset(self):  # split rows of QMM: u - i in [h + 2, d - h - 1]
        return 2 * self.min_hairpin + 3

    @property
    def split_lo(self):
        return self.min_hairpin + 2

    def block(self, d0, d1, length):
        return max(d1 - 2 * self.min_hairpin - 3, 1), length - d0

    def init_charts(self, inputs, length, widest):
        ref = inputs["arrays"]["cells"]
        batch, dtype = ref.shape[0], ref.dtype

        def blank(rows, cols):
            return jnp.full((batch, rows, cols), -jnp.inf, dtype)

        # QBs and QBr hold QS instead of QB without lonely pairs (see the class docstring).
        return {
            "QBs": blank(length + ROW_PAD, length + WINDOW),  # QB[i][i+w] at [w + ROW_PAD, i]
            # QB[j-w][j] at [L - w, j + WINDOW]; rows past L (negative widths) stay -inf.
            "QBr": blank(length + 1 + max(ROW_PAD, widest), length + WINDOW + widest),
            # QI, QM1, QM1x, QMM (and QB, see ml_segments) packed along the columns, a segment of L + 1 each; the
            # cell (i, i+w) at row w + 2, so that a diagonal's reads (widths d-2, d-1) never clamp.
            "ML": blank(length + 2, len(self.ml_segments) * (length + 1)),
            "QM1r": blank(length + widest + 2, length + widest + 1),  # QM1[j-w][j] at [L - w, j]
            "QMc": blank(length + 1, length),  # QM[i][i+m-1] at [m, i]
            # The exterior loop: F5[t - 1] at [0, t] (t = 0: the empty prefix; F5[0]: one base).
            "F5": blank(1, length + widest + 2).at[:, 0, :2].set(0),
        }

    def views(self, d, rows, width, length):
        lo = self.split_lo
        # Exterior stems (k, d) need k <= d - h - 1; rows = d1 - 2h - 3 for the chunk's last d1.
        stems = rows + self.min_hairpin + 1
        cell = {"cells": View("cells", d, 0, 1, width), "pair": View("pair", d, 0, 1, width)}
        window = {
            "qb_start": View("QBs", d, 0, WINDOW, width + WINDOW),  # widths d-32 .. d-2
            "qb_end": View("QBr", length - d + 2, d, WINDOW, width + WINDOW),
            **{name: View(name, d, 0, WINDOW, width + WINDOW) for name in START_INNER},
            **{name: View(name, length - d + 2, d, WINDOW, width + WINDOW) for name in END_INNER},
        }
        return {
            **cell, **window,
            "qm_left": View("QMc", lo, 0, rows, width),  # QM[i][i+m-1], m = lo ..
            "qm1_right": View("QM1r", length - d + lo, d, rows, width),  # QM1[i+m][j]
            # The multiloop rows of widths d-2 (row d) and d-1 (row d+1), one view per read
            # (a view of all the packed segments has an adjoint that is mostly zeros).
            **{name: View("ML", d + dw, self.ml_segments.index(chart) * (length + 1) + di, 1, width)
               for name, (chart, dw, di) in self._ml_reads().items()},
            # The exterior loop at end position d: stems (k, d) for k = 1 .. rows + 1 (k = 0 is
            # this diagonal's own cell), and the prefixes F5[k - 1] before them.
            "f5_prev": View("F5", 0, 1, 1, stems),  # F5[k - 1], k = 1 ..
            "stem_qb": View("QBr", length - d + 1, d + WINDOW, stems, 1),  # QB[k][d] (QS without lonely pairs)
            "stem_ext": View("ext_r", length - d + 1, d + WINDOW, stems, 1),
            "f5_last": View("F5", 0, d, 1, 1),  # F5[d - 1]
        }

    def _ml_reads(self):
        """The step's reads of the packed ML rows: name -> (chart, width - (d - 2), i offset)."""
        reads = {"qmm_inner": ("QMM", 0, 1), "qm1_prev": ("QM1", 1, 0), "qm1x_next": ("QM1x", 1, 1)}
        if self.no_lonely_pairs:
            reads["qb_inner"] = ("QB", 0, 1)  # QB[i+1][j-1], read by the stack
        return reads

    def writes(self, d, length):
        return {"QBs": (d + ROW_PAD, 0), "QBr": (length - d, d + WINDOW), "QM1r": (length - d, d),
                "QMc": (d + 1, 0), "ML": (d + 2, 0, len(self.ml_segments) * (length + 1)), "F5": (0, d + 1, 1)}

    def packed_stride(self, name, length):
        """The ML row packs its charts in segments of L + 1 columns (see ``init_charts``)."""
        return length + 1 if name == "ML" else None

    def pair_marks(self, arrays):
        """[B, L(d), L(i)]: the adjoint of the pair scores (added once per pair) marks the pairs."""
        return arrays["pair"]

    def step(self, sr, d, views, consts, *, known, exact, length):
        del exact
        width = views["qm_left"].shape[2]
        packed = views["cells"][:, :, 0]  # [B, field, width]
        # lax.split, whose transpose is one concatenate (each slice's pad would be added in full).
        cell = dict(zip(CELL_ARRAYS, (f[:, 0] for f in jax.lax.split(packed, (1,) * len(CELL_ARRAYS), axis=1))))
        cell["pair"] = views["pair"][:, 0]
        segments = self.ml_segments
        if "ML" in known:
            known = {**known, **_unpack_ml(known["ML"], segments, length, width)}

        # >= 2 stems in [i, j]: the one O(n^3) sum. Terms past a width's end are -inf.
        terms = jax.lax.optimization_barrier(views["qm_left"] + views["qm1_right"])
        # Materialised, and so its adjoint (a barrier's transpose is a barrier): fused into the
        # [rows, width] shares, the adjoint's chain of per-cell shares was recomputed per term.
        qmm = jax.lax.optimization_barrier(sr.sum(terms, axis=1, known=known.get("QMM")))

        # Interior loops: tabulated small loops, then each class's length sum.
        qb_start, qb_end = views["qb_start"], views["qb_end"]
        lin_start = _linear_window(qb_start) if sr.name == "log" else None
        lin_end = _linear_window(qb_end) if sr.name == "log" else None
        rho = lambda l1, l2: MAX_LOOP - (l1 + l2)
        # The small loops' inner pairs (l1, l2 <= 2) in one slice of the window: each loop's read
        # is a slice of it, so the outside pass pads each adjoint to this block, not the window.
        small = qb_start[:, MAX_LOOP - 4 : MAX_LOOP + 1, 1 : 3 + width]
        inner_qb = lambda l1, l2: small[:, rho(l1, l2) - (MAX_LOOP - 4), l1 : l1 + width]
        # QB[i+1][j-1]; the window holds QS without lonely pairs, where a stack reads the full QB.
        stacked_on = views["qb_inner"][:, 0] if self.no_lonely_pairs else inner_qb(0, 0)
        parts = [
            cell["stack"] + stacked_on,
            cell["bulge1_5"] + inner_qb(1, 0),
            cell["bulge1_3"] + inner_qb(0, 1),
            cell["int11"] + inner_qb(1, 1),
            cell["int12"] + inner_qb(1, 2),
            cell["int21"] + inner_qb(2, 1),
            cell["int22"] + inner_qb(2, 2),
        ]
        # Row r of a start block (l1 = fixed[r]) reads the inner pair at column i + l1 + 1; the end
        # window's column of cell i's inner pair (k, j - l2 - 1) is i + 30 - l2.
        blocks = [(block, outer, inner_name, qb_start, lin_start, BLOCKS[block][1][0] + 1)
                  for block, outer, inner_name in (("generic", "outer_generic", "inner_generic"),
                                                   ("23", "outer_23", "inner_23"),
                                                   ("1n_start", "outer_1n", "inner_1n"),
                                                   ("bulge_start", "outer_bulge", "inner_bulge"))]
        blocks += [(block, outer, inner_name, qb_end, lin_end, MAX_LOOP - BLOCKS[block][1][0])
                   for block, outer, inner_name in (("1n_end", "outer_1n", "inner_1n_r"),
                                                    ("bulge_end", "outer_bulge", "inner_bulge_r"))]
        if sr.name == "log" and known:
            # The outside pass (the engine hands it the saved rows as ``known``; the forward is
            # re-run under jax.vjp, then transposed): every
            # block's rows summed in linear space at once, the outer mismatch in the rows'
            # scales -- one exp per row and cell and one log per cell, and no exp in the
            # transpose, instead of a log per row and a log-sum-exp per block with its shares.
            # (In the inside pass this form measured no faster, ~10% slower at 1,000 nt.)
            rows = []
            for block, outer, inner_name, _, linear, shift in blocks:
                values, log_scale = _linear_loop_rows(consts[f"len_{block}"], views[inner_name], linear, shift, width)
                rows.append((values, log_scale + cell[outer][:, None]))
            parts.append(_sum_linear_rows(rows))
        else:
            for block, outer, inner_name, qb, linear, shift in blocks:
                loops = _loop_sums(sr, consts[f"len_{block}"], qb, views[inner_name], linear, shift,
                                   width)  # [B, rows, width]
                parts.append(cell[outer] + (sr.sum(loops, axis=1) if loops.shape[1] > 1 else loops[:, 0]))
        # Both materialised, as qmm: otherwise the outside pass recomputed the adjoint of qi, and
        # the parts' shares, for every element of the window's adjoint they are padded into.
        qi = jax.lax.optimization_barrier(
            sr.sum(jax.lax.optimization_barrier(jnp.stack(parts, axis=1)), axis=1, known=known.get("QI")))

        qmm_inner = views["qmm_inner"][:, 0]  # QMM[i+1][j-1]
        qm1_prev = views["qm1_prev"][:, 0]  # QM1[i][j-1]
        qm1x_next = views["qm1x_next"][:, 0]  # QM1x[i+1][j]
        closes = sr.plus(sr.plus(cell["hairpin"], qi), cell["ml_close"] + qmm_inner)
        # In the outside pass (given the saved rows) the per-cell chain is materialised link by
        # link, and so are its adjoints: XLA otherwise copies each link's exps and logs into every
        # consumer (2-5% at 8 x 200 nt; the inside passes go without: max_score was ~5% slower).
        chain = jax.lax.optimization_barrier if known else (lambda x: x)
        qb = chain(cell["pair"] + closes)
        # The pair as the other loops read it: any pair, or one that stacks on its inner pair.
        branch = cell["pair"] + parts[0] if self.no_lonely_pairs else qb
        b = consts["ml_base"][:, None]
        qm1 = chain(sr.plus(qm1_prev + b, branch + cell["ml_stem"], known=known.get("QM1")))
        qm1x = chain(sr.plus(qm1, qm1x_next + b, known=known.get("QM1x")))
        qm = sr.plus(qm1x, qmm, known=known.get("QMc"))
        rows = {"QI": qi, "QM1": qm1, "QM1x": qm1x, "QMM": qmm, "QB": qb}
        ml_row = jnp.concatenate([jnp.pad(rows[name], ((0, 0), (0, length + 1 - width)), constant_values=-jnp.inf)
                                  for name in segments], axis=1)
        # The exterior loop of the prefix x[0..d]: d unpaired, or a stem (k, d) after F5[k - 1].
        stems = jnp.concatenate([branch[:, :1] + cell["ext"][:, :1],  # k = 0: this diagonal's cell (0, d)
                                 views["f5_prev"][:, 0] + views["stem_qb"][:, :, 0] + views["stem_ext"][:, :, 0]],
                                axis=1)
        f5 = sr.plus(views["f5_last"][:, 0, 0], sr.sum(stems, axis=1),
                     known=known["F5"][:, 0] if "F5" in known else None)
        return {"QBs": branch, "QBr": branch, "QM1r": qm1, "QMc": qm, "ML": ml_row, "F5": f5[:, None]}, None

    def output(self, sr, arrays, consts, lengths, length):
        """F5[n-1] per sequence (0 for an empty one)."""
        f5 = arrays["F5"][:, 0]
        return f5[jnp.arange(f5.shape[0]), jnp.clip(lengths, 0, length)]
