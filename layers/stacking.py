"""The stacking grammar: 656 scores, stacked pairs and one loop score.

Grammar (0-based inclusive spans; empty spans have Z = Zn = 0, P = -inf)::

    P[i][j]  = pair[x_i,x_j] + phi[i][j]
               + ( stack[x_i,x_j,x_{j-1},x_{i+1}] + P[i+1][j-1]  (+)  loop + Zn[i+1][j-1] )
               if j - i > h, else -inf
    Zn[i][j] = unpaired[x_i] + Z[i+1][j]  (+)  SUM_{k=i+h+1}^{j-1} P[i][k] + Z[k+1][j]
    Z[i][j]  = Zn[i][j] (+) P[i][j];        log Z(x) = Z[0][n-1]

It is unambiguous: ``log Z(x) = log sum_s exp(score(s))`` over nested structures ``s``
(checked against the brute-force enumerator in ``layers/reference.py``).

The recursion folds the unpaired term into the split-point sum: with the *left
factor* ``F[i][i] = unpaired[x_i]`` and ``F[i][k] = P[i][k]`` (``k > i``),
``Zn[i][j] = SUM_{k=i}^{j-1} F[i][k] + Z[k+1][j]``. That one reduction is the O(n^3)
work; everything else is O(n) per diagonal. Charts (see ``layers/chart.py``):

* ``F[b, w, i]``  = F[i][i+w]            (indexed by span start)
* ``Zn[b, w+1, i]`` = Zn[i][i+w]         (row 0: the empty span)
* ``Zr[b, L-w, j]`` = Z[j-w][j]          (indexed by span end, width reversed)

For diagonal d the split terms of all cells are ``F[:, 0:M, 0:C] + Zr[:, L-d+1 : L-d+1+M,
d : d+C]``. The sum is taken in one exp pass, shifted by the lower bound
``Zn[i][j] >= Zn[i][j-1] + unpaired[x_j]`` (j left unpaired; see ``chart.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers.alphabet import NUM_TOKENS
from foldax.layers.chart import MAX_AUTO_CHUNKS, View

#: Shapes of the stacking grammar's parameters (``layers.init_params``).
PARAM_SHAPES = {
    "stack": (NUM_TOKENS,) * 4,
    "pair": (NUM_TOKENS,) * 2,
    "unpaired": (NUM_TOKENS,),
    "loop": (),
}


def skew(x, length):
    """[B, L, L] matrix -> [B, L(width d), L(start i)] with x[b, i, i + d] (0 past the end).

    A pad and two reshapes instead of a gather: row i of ``x`` flattened with stride
    ``L + 1`` puts ``x[i, i + d]`` at column d, and the transpose (the gradient) stays
    a cheap reshape too, not a scatter-add (measured ~20 ms on a 32 x 256 batch).
    """
    batch = x.shape[0]
    flat = jnp.pad(x.reshape(batch, length * length), ((0, 0), (0, length)))
    rows = flat.reshape(batch, length, length + 1)[:, :, :length]  # [b, i, d]
    past_end = np.arange(length)[None, :] + np.arange(length)[:, None] >= length  # [i, d]
    return jnp.swapaxes(jnp.where(past_end, jnp.zeros_like(rows), rows), 1, 2)


def shear(v, length):
    """[B, P] with P >= 2L -> [B, L(d), L(i)] with v[b, i + d] (a Hankel matrix, no gather)."""
    batch, size = v.shape
    tiled = jnp.broadcast_to(v[:, None, :], (batch, length, size)).reshape(batch, length * size)
    tiled = jnp.pad(tiled, ((0, 0), (0, length)))
    return tiled.reshape(batch, length, size + 1)[:, :, :length]


def lookup(table, indices):
    """table[indices...] for a small replicated table and (possibly sharded) token indices.

    One flat 1-D gather (XLA CPU miscompiles some multi-index gathers fused with
    selects, see issue 10). The result takes the indices' sharding, so the gather also
    works when the batch is sharded over an explicit mesh (``jax.make_mesh`` + ``jax.set_mesh``).
    """
    flat = indices[0]
    for size, index in zip(table.shape[1:], indices[1:]):
        flat = flat * size + index
    return table.reshape(-1).at[flat].get(out_sharding=jax.typeof(flat).sharding)


def cell_scores(params, tokens, phi=None):
    """Per-cell scores in the engine's width layout.

    tokens: int [B, L]; phi: [B, L, L] or None. Returns the engine inputs
    ``{"arrays": {"pair", "stack", "unpaired"}, "consts": {"loop"}}`` with
    ``pair[b, d, i] = pair[x_i, x_j] + phi[i, j]``,
    ``stack[b, d, i] = stack[x_i, x_j, x_{j-1}, x_{i+1}]`` (``j = i + d``),
    ``unpaired[b, i] = unpaired[x_i]`` and ``loop[b]``.
    """
    batch, length = tokens.shape
    dtype = jnp.result_type(*(params[k] for k in PARAM_SHAPES))
    x = jnp.clip(tokens, 0, NUM_TOKENS - 1)  # [B, L]
    padded = jnp.concatenate([x, jnp.full((batch, length + 1), NUM_TOKENS - 1, x.dtype)], axis=1)
    shape = (batch, length, length)
    x_i = jnp.broadcast_to(x[:, None, :], shape)
    x_ip1 = jnp.broadcast_to(padded[:, None, 1 : length + 1], shape)
    x_j = shear(padded, length)
    # x_{j-1}; at d = 0 (never a pair) any token will do.
    x_jm1 = shear(jnp.concatenate([padded[:, :1], padded], axis=1), length)
    pair_w = lookup(params["pair"].astype(dtype), (x_i, x_j))
    if phi is not None:
        pair_w = pair_w + skew(phi.astype(dtype), length)
    stack_w = lookup(params["stack"].astype(dtype), (x_i, x_j, x_jm1, x_ip1))
    unpaired = lookup(params["unpaired"].astype(dtype), (x,))
    loop = jnp.broadcast_to(params["loop"].astype(dtype), (batch,))  # one per sequence (vmap folds it)
    return {"arrays": {"pair": pair_w, "stack": stack_w, "unpaired": unpaired}, "consts": {"loop": loop}}


@dataclasses.dataclass(frozen=True)
class StackingGrammar:
    """The stacking grammar's recursion for the chart engine (``min_hairpin`` static)."""

    min_hairpin: int = 3
    first_diagonal = 1  # diagonal 0 (single bases) is filled by init_charts
    one_pass = True  # Zn has a lower bound from the previous diagonal
    cell_cost = 0
    row_offset = 1
    max_auto_chunks = MAX_AUTO_CHUNKS

    def block(self, d0, d1, length):
        """(split rows, cells) read by every diagonal of the chunk [d0, d1)."""
        return max(d1 - 1, 1), length - d0

    def init_charts(self, inputs, length, widest):
        """Blank charts with diagonal 0 filled: Zn[i][i] = Z[i][i] = unpaired[x_i].

        Rows past width 0 of ``Zr`` (spans of negative width) hold -inf, so a split term
        at k >= j reads nothing: in the outside pass the F rows of wider spans are filled.
        """
        unpaired = inputs["arrays"]["unpaired"]
        batch, dtype = unpaired.shape[0], unpaired.dtype
        F = jnp.full((batch, length, length + 1), -jnp.inf, dtype)
        F = F.at[:, 0, :length].set(unpaired)
        Zn = jnp.zeros((batch, length + 1, length + 1), dtype).at[:, 1, :length].set(unpaired)
        Zr = jnp.full((batch, length + widest + 2, length + widest + 1), -jnp.inf, dtype)
        Zr = Zr.at[:, :length].set(0).at[:, length, :length].set(unpaired)
        return {"F": F, "Zn": Zn, "Zr": Zr}

    def views(self, d, rows, width, length):
        return {
            "left": View("F", 0, 0, rows, width),  # F[i][i+m], m < d
            "right": View("Zr", length - d + 1, d, rows, width),  # Z[i+m+1][i+d]
            "zn_prev": View("Zn", d, 0, 1, width),  # Zn[i][j-1]
            "unpaired_j": View("F", 0, d, 1, width),  # unpaired[x_j]
            "pair": View("pair", d, 0, 1, width),
            "stack": View("stack", d, 0, 1, width),
            "p_inner": View("F", d - 2, 1, 1, width),  # P[i+1][j-1] (clamped, masked, for d < 2)
            "zn_inner": View("Zn", d - 1, 1, 1, width),  # Zn[i+1][j-1]
        }

    def writes(self, d, length):
        return {"F": (d, 0), "Zn": (d + 1, 0), "Zr": (length - d, d)}

    def pair_marks(self, arrays):
        """[B, L(d), L(i)] from adjoints of the inputs: the pair score is added once per pair,
        so its adjoint marks the pairs (0/1 in the sampling semiring)."""
        return arrays["pair"]

    def step(self, sr, d, views, consts, *, known, exact, length):
        width = views["pair"].shape[-1]
        neg_inf = jnp.array(-jnp.inf, views["pair"].dtype)
        # Materialised once: read through the dynamic slice of Zr inside the exp loop,
        # the split terms cost ~25% more (measured).
        terms = jax.lax.optimization_barrier(views["left"] + views["right"])
        ok = None
        if exact:
            zn = sr.sum(terms, axis=1, known=known.get("Zn"))
        else:
            lower = jax.lax.optimization_barrier(views["zn_prev"][:, 0] + views["unpaired_j"][:, 0])
            zn, ok = sr.sum_from_below(terms, lower, axis=1, known=known.get("Zn"))
        # Cells past the chart's end (i + d >= L) are never read: -inf keeps them inert.
        zn = jnp.where(jnp.arange(width) < length - d, zn, neg_inf)
        stacked = jnp.where(d - 2 > self.min_hairpin, views["stack"][:, 0] + views["p_inner"][:, 0], neg_inf)
        looped = consts["loop"][:, None] + views["zn_inner"][:, 0]
        p = jnp.where(d > self.min_hairpin, views["pair"][:, 0] + sr.plus(stacked, looped), neg_inf)
        z = sr.plus(zn, p, known=known.get("Zr"))
        return {"F": p, "Zn": zn, "Zr": z}, ok

    def output(self, sr, arrays, consts, lengths, length):
        """Z[0][n-1] per sequence (0 for an empty one)."""
        Zr = arrays["Zr"]
        n = jnp.clip(lengths, 1, length)
        values = Zr[jnp.arange(Zr.shape[0]), length - (n - 1), n - 1]
        return jnp.where(lengths > 0, values, jnp.zeros_like(values))
