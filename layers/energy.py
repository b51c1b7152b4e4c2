"""Turner 2004 free energy of given structures in JAX: batched, jit-able, differentiable.

:func:`loop_energy` evaluates ``E(s)`` (kcal/mol) of a batch of (sequence, structure) pairs under
the Turner 2004 model exactly as :mod:`foldax.layers.energy_reference` (and ViennaRNA's
``eval_structure``) define it; ``pf=True`` gives the partition-function energies. The result is
differentiable with respect to every table of the parameter pytree
(:mod:`foldax.layers.energy_params`), special hairpin energies included: the gradient of ``E(s)`` is
the count of each table entry's uses in ``s``.

How (O(n log n) time, O(n) memory per sequence, no sequential scan):

* ``b[k]`` = number of pairs opened before position k and not yet closed (an exclusive prefix
  sum). In a nested structure, the innermost pair enclosing a position k that is not a closing
  position, and the partner of a closing position k, are both the last opening position o < k
  with ``b[o] = b[k] - 1``. One sort of the keys ``b[o] * (L + 1) + o`` of the opening positions
  and one ``searchsorted`` answer that for every k; a pair table is nested exactly when every
  closing position finds its own partner this way.
* Each pair (i, j) then knows its loop: the number of pairs directly inside (0 hairpin, 1 stack /
  bulge / interior, >= 2 multiloop), the unpaired bases directly inside, and (for one child) the
  inner pair; segment sums give these. ``E`` is the sum over pairs of the energy of the loop the
  pair closes, plus for each pair its share as a branch of the loop that encloses it (multiloop
  stem term or exterior-loop term).
* Every table entry is read by one flat 1-D lookup (``table.reshape(-1)[flat_index]``, indices
  clipped), then selected with ``where`` (XLA CPU has miscompiled multi-index gathers fused with
  selects, issue 10). Masked-out inputs to ``log`` are replaced before the call, so neither values
  nor gradients become NaN, also with the ``+inf`` entries of the tables.

Structures outside the Turner grammar: ``valid`` is False for a non-canonical pair, a hairpin
with fewer than 3 unpaired bases, an interior loop or bulge of more than 30 unpaired bases, or a
pair table that is not a nested, symmetric table of partners in ``[0, length)``. The energy is then
as the reference gives it: +inf for non-canonical pairs, the tables' values for short hairpins
(+inf in Turner 2004), ViennaRNA's extrapolation for large interior loops, +inf for tables that are
not nested structures. Positions at or beyond ``lengths`` are padding: their tokens and pair-table entries are
ignored, and a pair reaching into them makes the structure invalid.

Large-loop extrapolation: ``pf=False`` truncates ``100 lxc ln(n/30)`` toward zero as ViennaRNA's
integer energies do (its derivative with respect to ``lxc`` is then 0); ``pf=True`` leaves hairpins
untruncated (ViennaRNA's partition function), and caps the ninio term of 2x3 loops by
``max_ninio``.

>>> import numpy as np
>>> from foldax.layers.alphabet import encode_batch
>>> from foldax.layers.dotbracket import from_dot_bracket
>>> from foldax.layers.energy_params import turner2004
>>> tokens, lengths = encode_batch(["GGGGAAACCCC", "GCUUCGGC"], buckets=None)
>>> pt = np.full(tokens.shape, -1)
>>> pt[0, :11], pt[1, :8] = from_dot_bracket("((((...))))"), from_dot_bracket("((....))")
>>> energy, valid = loop_energy(turner2004(), tokens, pt, lengths)
>>> [round(float(e), 4) for e in energy], np.asarray(valid).tolist()
([-4.5, 0.3], [True, True])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers.alphabet import encode
from foldax.layers.energy_params import MAX_LOOP, PAIR_INDEX, SPECIAL_HAIRPIN_LENGTHS, check_energy_params

__all__ = ["loop_energy"]

_N = 4  # N token: never pairs, never part of a special hairpin
_MAX_WIDTH = 46000  # (L + 1)^2 must fit the int32 sort keys
_PAIR_FLAT = PAIR_INDEX.reshape(-1).astype(np.int32)  # pair type of (x, y) at x * 5 + y, -1 if none
_AU_TYPES = np.array([0, 0, 1, 1, 1, 1], dtype=bool)  # GU UG AU UA get the terminal penalty


def _pair_type(a, b):
    """Pair type of tokens (a, b), -1 if they do not pair (one flat lookup)."""
    return jnp.asarray(_PAIR_FLAT)[a * 5 + b]


def _terminal_au(params, t):
    """terminal_au for pair types GU UG AU UA, else 0."""
    return jnp.where(jnp.asarray(_AU_TYPES)[jnp.clip(t, 0, 5)], params["terminal_au"], 0.0)


def loop_energy(params, tokens, pair_table, lengths=None, *, pf: bool = False):
    """Free energy (kcal/mol) of each structure and whether the Turner grammar allows it.

    Args:
      params: the Turner parameter pytree (:func:`foldax.layers.energy_params.turner2004`).
      tokens: int ``[B, L]`` (or ``[L]``) tokens ``A=0 C=1 G=2 U=3 N=4``.
      pair_table: int ``[B, L]`` (or ``[L]``): 0-based partner of each position, -1 if unpaired.
      lengths: int ``[B]`` (or scalar) sequence lengths, clipped to ``[0, L]``; default ``L``.
      pf: ``True`` for the energies of ViennaRNA's partition function (see the module docstring).

    Returns:
      ``(energy, valid)``: float ``[B]`` in the parameters' dtype, bool ``[B]`` (scalars for
      unbatched input). Jit-able (``pf`` static), vmap-able, differentiable in ``params``.
    """
    check_energy_params(params)
    tokens = jnp.asarray(tokens)
    pair_table = jnp.asarray(pair_table)
    if tokens.shape != pair_table.shape or tokens.ndim not in (1, 2):
        raise ValueError(f"tokens {tokens.shape} and pair_table {pair_table.shape} must both be [L] or [B, L]")
    single = tokens.ndim == 1
    if single:
        tokens, pair_table = tokens[None], pair_table[None]
    batch, width = tokens.shape
    if width > _MAX_WIDTH:
        raise ValueError(f"sequences of up to {_MAX_WIDTH} positions are supported (int32 sort keys), got {width}")
    if lengths is None:
        lengths = jnp.full((batch,), width, dtype=jnp.int32)
    lengths = jnp.clip(jnp.broadcast_to(jnp.asarray(lengths, dtype=jnp.int32), (batch,)), 0, width)
    energy, valid = _batched(params, tokens.astype(jnp.int32), pair_table.astype(jnp.int32), lengths, pf=bool(pf))
    return (energy[0], valid[0]) if single else (energy, valid)


@functools.partial(jax.jit, static_argnames=("pf",))
def _batched(params, tokens, pair_table, lengths, *, pf):
    special = _special_arrays(params)
    return jax.vmap(lambda x, pt, n: _one(params, special, x, pt, n, pf=pf))(tokens, pair_table, lengths)


def _special_arrays(params):
    """Special hairpin keys as static token arrays per length, energies as traced vectors."""
    out = {}
    for length in SPECIAL_HAIRPIN_LENGTHS:
        keys = sorted(k for k in params["special_hairpins"] if len(k) == length)
        if keys:
            tokens = np.stack([encode(k) for k in keys]).astype(np.int32)
            energies = jnp.stack([jnp.asarray(params["special_hairpins"][k]) for k in keys])
            out[length] = (tokens, energies)
    return out


def _lookup(table, *indices_and_sizes):
    """``table[i0, i1, ...]`` as one flat 1-D gather; indices are clipped into range."""
    flat = jnp.zeros_like(indices_and_sizes[0][0])
    for index, size in indices_and_sizes:
        flat = flat * size + jnp.clip(index, 0, size - 1)
    return table.reshape(-1)[flat]


def _one(params, special, x, pt, n, *, pf):
    """Energy and validity of one structure (x, pt: [L] int32, n: scalar length)."""
    dtype = params["stack"].dtype
    L = x.shape[0]
    idx = jnp.arange(L, dtype=jnp.int32)
    inside = idx < n
    x = jnp.where(inside, x, _N)
    pt = jnp.where(inside, pt, -1)

    # --- structure: well-formed, nested; enclosing pair of every position ------------------
    paired = pt >= 0
    partner = jnp.clip(pt, 0, L - 1)
    in_range = (pt >= -1) & (pt < n)
    symmetric = ~paired | ((pt[partner] == idx) & (pt != idx))
    well_formed = jnp.all(in_range & symmetric)
    opener = paired & (pt > idx)
    closer = paired & (pt < idx)
    step = opener.astype(jnp.int32) - closer.astype(jnp.int32)
    balance = jnp.cumsum(step) - step  # open pairs before k, exclusive
    stride = L + 1
    keys = jnp.sort(jnp.where(opener, balance * stride + idx, stride * stride + idx))
    level = balance - 1
    query = level * stride + idx
    found_at = jnp.searchsorted(keys, query, side="left") - 1
    found_key = keys[jnp.clip(found_at, 0, L - 1)]
    found = (found_at >= 0) & (level >= 0) & (found_key // stride == level)
    enclosing = jnp.where(found, found_key % stride, -1)  # -1: the exterior loop
    nested = jnp.all(~closer | (enclosing == pt))
    parent = jnp.where(closer, -1, enclosing)

    # --- per loop: children, unpaired bases, the one inner pair of an interior loop --------
    segment = jnp.where(parent >= 0, parent, L)  # segment L collects the exterior loop
    children = jnp.zeros(L + 1, jnp.int32).at[segment].add(opener.astype(jnp.int32))[:L]
    unpaired = jnp.zeros(L + 1, jnp.int32).at[segment].add((inside & ~paired).astype(jnp.int32))[:L]
    child = jnp.full(L + 1, -1, jnp.int32).at[segment].max(jnp.where(opener, idx, -1))[:L]

    i, j = idx, partner
    xi, xj = x, x[partner]
    t = _pair_type(xi, xj)  # type of (i, j) for an opener i
    canonical = jnp.all(~opener | (t >= 0))

    def at(k):
        """The token at position(s) k (clipped into the array; masked by the caller)."""
        return x[jnp.clip(k, 0, L - 1)]

    def au(tt):
        return _terminal_au(params, tt)

    # hairpin closed by (i, j)
    u = j - i - 1
    hairpin = _loop_length(params, "hairpin", u, truncate=not pf)
    hairpin_mm = hairpin + _lookup(params["mismatch_hairpin"], (t, 6), (at(i + 1), 5), (at(j - 1), 5))
    hairpin_e = jnp.where(u == 3, hairpin + au(t), hairpin_mm)
    hairpin_e = jnp.where(u < 3, hairpin, hairpin_e)
    for length, (key_tokens, key_energies) in special.items():
        window = at(i[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :])  # [L, length]
        match = jnp.all(window[:, None, :] == key_tokens[None, :, :], axis=-1)  # [L, keys]
        hit = jnp.any(match, axis=-1) & (u == length - 2)
        value = key_energies[jnp.argmax(match, axis=-1)]
        hairpin_e = jnp.where(hit, value, hairpin_e)

    # interior-type loop between (i, j) and its one inner pair (k, l)
    k = jnp.clip(child, 0, L - 1)
    l = partner[k]
    t2 = _pair_type(x[l], x[k])  # inner pair read from inside the loop
    n1, n2 = k - i - 1, j - l - 1
    interior_e, interior_size = _interior(params, t, t2, n1, n2, at(i + 1), at(j - 1), at(l + 1), at(k - 1), pf=pf)
    interior_e = jnp.where(t2 >= 0, interior_e, jnp.inf)

    # multiloop closed by (i, j): closing term + the closing stem read as (j, i)
    t_ji = _pair_type(xj, xi)
    multi_e = (
        params["ml_closing"]
        + unpaired.astype(dtype) * params["ml_base"]
        + params["ml_intern"]
        + au(t_ji)
        + _lookup(params["mismatch_multi"], (t_ji, 6), (at(j - 1), 5), (at(i + 1), 5))
    )

    closes = jnp.where(children == 0, hairpin_e, jnp.where(children == 1, interior_e, multi_e))

    # each pair as a branch of the loop around it: multiloop stem or exterior-loop stem
    parent_children = children[jnp.clip(parent, 0, L - 1)]
    multi_branch = (
        params["ml_intern"] + au(t) + _lookup(params["mismatch_multi"], (t, 6), (at(i - 1), 5), (at(j + 1), 5))
    )
    has5, has3 = i > 0, j < n - 1
    exterior_branch = au(t) + jnp.where(
        has5 & has3,
        _lookup(params["mismatch_exterior"], (t, 6), (at(i - 1), 5), (at(j + 1), 5)),
        jnp.where(
            has5,
            _lookup(params["dangle5"], (t, 6), (at(i - 1), 5)),
            jnp.where(has3, _lookup(params["dangle3"], (t, 6), (at(j + 1), 5)), 0.0),
        ),
    )
    branch = jnp.where(parent < 0, exterior_branch, jnp.where(parent_children >= 2, multi_branch, 0.0))

    per_pair = jnp.where(opener, closes.astype(dtype) + branch.astype(dtype), 0.0)
    structural = well_formed & nested
    energy = jnp.where(structural & canonical, jnp.sum(per_pair), jnp.inf).astype(dtype)
    short_hairpin = jnp.any(opener & (children == 0) & (u < 3))
    large_interior = jnp.any(opener & (children == 1) & (interior_size > MAX_LOOP))
    valid = structural & canonical & ~short_hairpin & ~large_interior
    return energy, valid


def _extrapolation(params, n, *, truncate):
    """lxc ln(n/30) for n > 30 (0 otherwise); truncated toward zero in dcal/mol if ``truncate``."""
    dtype = params["lxc"].dtype
    large = n > MAX_LOOP
    ratio = jnp.where(large, n, MAX_LOOP).astype(dtype) / MAX_LOOP  # log(1) = 0 where masked
    dcal = (params["lxc"] * 100) * jnp.log(ratio)
    if truncate:
        dcal = jnp.trunc(dcal)
    return jnp.where(large, dcal / 100, 0.0)


def _loop_length(params, table, n, *, truncate):
    """``table[n]`` for n <= 30, ``table[30] + lxc ln(n/30)`` beyond (n clipped at 0)."""
    return _lookup(params[table], (jnp.minimum(n, MAX_LOOP), MAX_LOOP + 1)) + _extrapolation(
        params, n, truncate=truncate
    )


def _interior(params, t1, t2, n1, n2, a, b, c, d, *, pf):
    """Stack, bulge or interior loop energy for outer type t1, inner type t2 (read from inside),
    unpaired n1 (5' side) and n2 (3' side), outer mismatch (a, b) = (x[i+1], x[j-1]) and inner
    mismatch (c, d) = (x[l+1], x[k-1]). Returns (energy, n1 + n2)."""
    p = params
    nl, ns = jnp.maximum(n1, n2), jnp.minimum(n1, n2)
    size = n1 + n2
    stack = _lookup(p["stack"], (t1, 6), (t2, 6))
    au = _terminal_au(p, t1) + _terminal_au(p, t2)
    bulge = _loop_length(p, "bulge", nl, truncate=True) + jnp.where(nl == 1, stack, au)

    def ninio(asymmetry):
        return jnp.minimum(p["max_ninio"], asymmetry.astype(p["ninio"].dtype) * p["ninio"])

    int11 = _lookup(p["int11"], (t1, 6), (t2, 6), (a, 5), (b, 5))
    int12 = _lookup(p["int21"], (t1, 6), (t2, 6), (a, 5), (c, 5), (b, 5))  # 1 nt 5', 2 nt 3'
    int21 = _lookup(p["int21"], (t2, 6), (t1, 6), (c, 5), (a, 5), (d, 5))  # 2 nt 5', 1 nt 3'
    int22 = _lookup(p["int22"], (t1, 6), (t2, 6), (a, 5), (d, 5), (c, 5), (b, 5))

    def mismatches(table):
        return _lookup(p[table], (t1, 6), (a, 5), (b, 5)) + _lookup(p[table], (t2, 6), (c, 5), (d, 5))

    one_n = _loop_length(p, "interior", nl + 1, truncate=True) + ninio(nl - ns) + mismatches("mismatch_interior_1n")
    two_three = p["interior"][5] + (ninio(jnp.ones_like(nl)) if pf else p["ninio"]) + mismatches("mismatch_interior_23")
    generic = _loop_length(p, "interior", size, truncate=True) + ninio(nl - ns) + mismatches("mismatch_interior")

    energy = jnp.select(
        [
            nl == 0,
            ns == 0,
            (ns == 1) & (nl == 1),
            (ns == 1) & (nl == 2) & (n1 == 1),
            (ns == 1) & (nl == 2),
            ns == 1,
            (ns == 2) & (nl == 2),
            (ns == 2) & (nl == 3),
        ],
        [stack, bulge, int11, int12, int21, one_n, int22, two_three],
        generic,
    )
    return energy, size
