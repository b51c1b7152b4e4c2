"""Float64 reference evaluator of the Turner 2004 model: the free energy of one given structure.

A plain Python/NumPy loop decomposition, written from the model's definition (ViennaRNA 2.x with
``RNA.md()`` defaults: dangles=2, special hairpins, no lonely-pair restriction) to serve as the
oracle of the JAX evaluator (:mod:`foldax.layers.energy`) and of the DP. All energies in kcal/mol.

A nested secondary structure decomposes into loops; ``E(s)`` is the sum of their energies.
With ``t(p, q)`` the pair type of (x_p, x_q) (:data:`~foldax.layers.energy_params.PAIR_INDEX`),
``AU(t)`` = ``terminal_au`` if t is AU, UA, GU or UG (else 0), and ``ext(n) = lxc * ln(n / 30)``:

* **hairpin** closed by (i, j), u = j - i - 1 unpaired:
  ``L(u) = hairpin[u]`` (u <= 30) or ``hairpin[30] + ext(u)``. If the sequence x[i..j] is a
  special hairpin (u = 3, 4, 6) its tabulated energy is the whole loop energy; otherwise u = 3
  gives ``L(3) + AU(t(i,j))`` and u >= 4 gives ``L(u) + mismatch_hairpin[t(i,j), x[i+1], x[j-1]]``.
  u < 3 gives ``hairpin[u]`` (+inf in Turner 2004).
* **stack / bulge / interior** loop between outer (i, j) and inner (k, l), n1 = k - i - 1,
  n2 = j - l - 1, T = t(i, j), T' = t(l, k) (the inner pair read from inside):
  stack ``stack[T, T']``; bulge (one side 0, other n) ``bulge[n]`` (+ ``stack[T, T']`` if n = 1,
  else + AU(T) + AU(T')); 1x1 ``int11[T, T', x[i+1], x[j-1]]``; 1x2 ``int21[T, T', x[i+1],
  x[l+1], x[j-1]]``; 2x1 ``int21[T', T, x[l+1], x[i+1], x[k-1]]``; 2x2 ``int22[T, T', x[i+1],
  x[k-1], x[l+1], x[j-1]]``; 1xn (n >= 3) ``interior[n+1] + min(max_ninio, (n-1) ninio) +
  mm1n[T, x[i+1], x[j-1]] + mm1n[T', x[l+1], x[k-1]]``; 2x3 ``interior[5] + ninio +
  mm23[T, ..] + mm23[T', ..]`` (ninio uncapped, as ViennaRNA's eval does); otherwise
  ``interior[n1+n2] + min(max_ninio, |n1-n2| ninio) + mmI[T, ..] + mmI[T', ..]``. Loop lengths
  beyond 30 use ``X[30] + ext(n)`` for X = bulge, interior.
* **multiloop** closed by (i, j) with branches (p, q) and u unpaired: ``ml_closing + u ml_base``
  plus, for every branch and for the closing pair read as (j, i), ``ml_intern + AU(t) +
  mismatch_multi[t(p,q), x[p-1], x[q+1]]`` (dangles=2: the neighbours count even when paired).
* **exterior loop**: for every outermost pair (p, q), ``AU(t(p,q))`` plus
  ``mismatch_exterior[t, x[p-1], x[q+1]]`` if both neighbours exist, ``dangle5[t, x[p-1]]`` if only
  the 5' one does (q is the last base), ``dangle3[t, x[q+1]]`` if only the 3' one does, else 0.

Eval versus partition function (``pf``). ViennaRNA's ``eval_structure`` works in integer dcal/mol:
every ``ext(n)`` is truncated toward zero in dcal, ``trunc(100 lxc ln(n/30)) / 100``. Its partition
function (with ``md.pf_smooth = 0``; the default ``pf_smooth = 1`` smooths the same terms) uses
Boltzmann factors that differ in two places, reproduced by ``pf=True``:

* hairpins longer than 30 use the untruncated ``lxc ln(u/30)`` (``exp_E_Hairpin``); bulges and
  interior loops beyond 30 never occur in the partition function (MAXLOOP) and keep the truncated
  form here;
* the ninio term of 2x3 loops is capped by ``max_ninio`` (eval adds ``ninio`` uncapped; equal
  unless ninio > max_ninio).

``sum_s exp(-E_pf(s)/kT)`` over all structures is then ViennaRNA's partition function. (ViennaRNA
also clips ``mismatch_multi``, ``mismatch_exterior``, ``dangle5`` and ``dangle3`` at zero, in eval
and partition function alike; :func:`~foldax.layers.energy_params.load_parameter_file` applies that clip
when it reads a file, so the tables here are used as they are.)

Structures with a pair that is not AU, CG, GU (either orientation) get +inf; a loop that uses a
+inf table entry (hairpins with fewer than 3 unpaired bases in Turner 2004) is +inf, where
ViennaRNA's integer eval returns its INF sentinel (>= 100000 kcal/mol). Loops larger than 30 are
evaluated by extrapolation like ViennaRNA's eval, although the Turner grammar (and ViennaRNA's
folding) never produces interior loops or bulges of more than 30 nucleotides.

>>> from foldax.layers.energy_params import turner2004
>>> params = turner2004()
>>> round(reference_free_energy(params, "GGGGAAACCCC", "((((...))))"), 6)
-4.5
>>> [(loop.kind, loop.pair, round(loop.energy, 2)) for loop in reference_loop_energies(params, "GGGGAAACCCC", "((((...))))")][:3]
[('exterior', None, 0.0), ('stack', (0, 10), -3.3), ('stack', (1, 9), -3.3)]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from foldax.layers.alphabet import ALPHABET, encode
from foldax.layers.dotbracket import from_dot_bracket, table_from_pairs, validate_pair_table
from foldax.layers.energy_params import MAX_LOOP, PAIR_INDEX, SCALAR_NAMES, TABLE_SHAPES, check_energy_params

__all__ = [
    "LoopEnergy",
    "reference_free_energy",
    "reference_loop_energies",
    "hairpin_energy",
    "interior_energy",
    "multiloop_energy",
    "exterior_energy",
    "enumerate_turner_structures",
    "brute_force_ensemble_free_energy",
    "as_pair_table",
    "numpy_params",
]

_AU_TYPES = (2, 3, 4, 5)  # GU UG AU UA get the terminal AU/GU penalty (ViennaRNA: type > 2)


class LoopEnergy(NamedTuple):
    """One loop of a structure: ``kind`` (exterior, hairpin, stack, bulge, interior, multi), its
    closing pair (0-based, None for the exterior loop), the pairs it encloses, and its energy."""

    kind: str
    pair: tuple[int, int] | None
    inner: tuple[tuple[int, int], ...]
    energy: float


def numpy_params(params) -> dict:
    """The parameter pytree as float64 NumPy arrays (special hairpins as Python floats)."""
    check_energy_params(params)
    out = {key: np.asarray(params[key], dtype=np.float64) for key in list(TABLE_SHAPES) + list(SCALAR_NAMES)}
    out["special_hairpins"] = {
        seq: float(np.asarray(e, dtype=np.float64)) for seq, e in params["special_hairpins"].items()
    }
    return out


def as_pair_table(structure, n: int) -> np.ndarray:
    """A dot-bracket string, pair table (partner or -1) or list of (i, j) pairs -> nested pair table."""
    if isinstance(structure, str):
        pt = from_dot_bracket(structure)
    else:
        array = np.asarray(structure)
        if array.ndim == 2 or (array.ndim == 1 and array.size == 0 and isinstance(structure, (list, tuple))):
            pt = table_from_pairs([tuple(p) for p in array.reshape(-1, 2)], n)
        else:
            pt = validate_pair_table(array)
    if len(pt) != n:
        raise ValueError(f"structure has length {len(pt)} but the sequence has length {n}")
    return validate_pair_table(pt, nested=True)


def _tokens(sequence) -> np.ndarray:
    if isinstance(sequence, str):
        return encode(sequence)
    tokens = np.asarray(sequence)
    if tokens.ndim != 1 or (tokens.size and (tokens.min() < 0 or tokens.max() > 4)):
        raise ValueError("sequence must be a string or a 1-D array of tokens 0..4")
    return tokens.astype(np.int64)


def _extrapolate(params: dict, n: int, *, truncate: bool) -> float:
    """lxc ln(n / 30) in kcal/mol; truncated toward zero in dcal/mol as ViennaRNA's integer eval does."""
    value = 100.0 * params["lxc"] * math.log(n / MAX_LOOP)
    return (math.trunc(value) if truncate else value) / 100.0


def _loop_length_term(params: dict, table: str, n: int, *, truncate: bool) -> float:
    if n <= MAX_LOOP:
        return float(params[table][n])
    return float(params[table][MAX_LOOP]) + _extrapolate(params, n, truncate=truncate)


def _au(params: dict, t: int) -> float:
    return float(params["terminal_au"]) if t in _AU_TYPES else 0.0


def hairpin_energy(params: dict, x, i: int, j: int, *, pf: bool = False) -> float:
    """Energy of the hairpin closed by (i, j); ``params`` from :func:`numpy_params`, ``x`` tokens."""
    t = int(PAIR_INDEX[x[i], x[j]])
    if t < 0:
        return math.inf
    u = j - i - 1
    energy = _loop_length_term(params, "hairpin", u, truncate=not pf)
    if u < 3:
        return energy
    if u in (3, 4, 6):
        loop = "".join(ALPHABET[b] for b in x[i : j + 1])
        if loop in params["special_hairpins"]:
            return params["special_hairpins"][loop]
    if u == 3:
        return energy + _au(params, t)
    return energy + float(params["mismatch_hairpin"][t, x[i + 1], x[j - 1]])


def interior_energy(params: dict, x, i: int, j: int, k: int, l: int, *, pf: bool = False) -> tuple[str, float]:
    """(kind, energy) of the loop between outer pair (i, j) and inner pair (k, l)."""
    t1 = int(PAIR_INDEX[x[i], x[j]])
    t2 = int(PAIR_INDEX[x[l], x[k]])
    n1, n2 = k - i - 1, j - l - 1
    nl, ns = max(n1, n2), min(n1, n2)
    if t1 < 0 or t2 < 0:
        return ("stack" if nl == 0 else "bulge" if ns == 0 else "interior"), math.inf
    p = params
    if nl == 0:
        return "stack", float(p["stack"][t1, t2])
    if ns == 0:
        energy = _loop_length_term(p, "bulge", nl, truncate=True)
        if nl == 1:
            energy += float(p["stack"][t1, t2])
        else:
            energy += _au(p, t1) + _au(p, t2)
        return "bulge", energy
    a, b = x[i + 1], x[j - 1]  # mismatch of the outer pair, seen from inside
    c, d = x[l + 1], x[k - 1]  # mismatch of the inner pair read as (l, k)

    def ninio(asymmetry: int) -> float:
        return min(float(p["max_ninio"]), asymmetry * float(p["ninio"]))

    if ns == 1 and nl == 1:
        energy = float(p["int11"][t1, t2, a, b])
    elif ns == 1 and nl == 2:
        if n1 == 1:
            energy = float(p["int21"][t1, t2, a, c, b])
        else:
            energy = float(p["int21"][t2, t1, c, a, d])
    elif ns == 1:
        energy = _loop_length_term(p, "interior", nl + 1, truncate=True) + ninio(nl - ns)
        energy += float(p["mismatch_interior_1n"][t1, a, b] + p["mismatch_interior_1n"][t2, c, d])
    elif ns == 2 and nl == 2:
        energy = float(p["int22"][t1, t2, a, d, c, b])
    elif ns == 2 and nl == 3:
        energy = float(p["interior"][5]) + (ninio(1) if pf else float(p["ninio"]))
        energy += float(p["mismatch_interior_23"][t1, a, b] + p["mismatch_interior_23"][t2, c, d])
    else:
        energy = _loop_length_term(p, "interior", nl + ns, truncate=True) + ninio(nl - ns)
        energy += float(p["mismatch_interior"][t1, a, b] + p["mismatch_interior"][t2, c, d])
    return "interior", energy


def multiloop_energy(params: dict, x, i: int, j: int, branches, unpaired: int) -> float:
    """Energy of the multiloop closed by (i, j) with the given branches and unpaired count."""
    p = params
    energy = float(p["ml_closing"]) + unpaired * float(p["ml_base"])
    stems = [(j, i)] + list(branches)  # the closing pair is read from inside the loop as (j, i)
    for a, b in stems:
        t = int(PAIR_INDEX[x[a], x[b]])
        if t < 0:
            return math.inf
        energy += float(p["ml_intern"]) + _au(p, t) + float(p["mismatch_multi"][t, x[a - 1], x[b + 1]])
    return energy


def exterior_energy(params: dict, x, branches) -> float:
    """Energy of the exterior loop with the given outermost pairs (dangles at the sequence ends)."""
    p = params
    n = len(x)
    energy = 0.0
    for a, b in branches:
        t = int(PAIR_INDEX[x[a], x[b]])
        if t < 0:
            return math.inf
        energy += _au(p, t)
        if a > 0 and b < n - 1:
            energy += float(p["mismatch_exterior"][t, x[a - 1], x[b + 1]])
        elif a > 0:
            energy += float(p["dangle5"][t, x[a - 1]])
        elif b < n - 1:
            energy += float(p["dangle3"][t, x[b + 1]])
    return energy


def _children(pt: np.ndarray, start: int, stop: int) -> tuple[list[tuple[int, int]], int]:
    """Pairs directly inside positions start..stop-1 and the number of unpaired positions there."""
    branches, unpaired, k = [], 0, start
    while k < stop:
        if pt[k] > k:
            branches.append((k, int(pt[k])))
            k = int(pt[k]) + 1
        else:
            unpaired += 1
            k += 1
    return branches, unpaired


def reference_loop_energies(params, sequence, structure, *, pf: bool = False) -> list[LoopEnergy]:
    """The loops of ``structure`` on ``sequence`` with their energies (kcal/mol), exterior loop first,
    then the loop closed by each pair in order of its 5' position.

    ``sequence``: a string (read by :func:`foldax.layers.encode`: T = U, IUPAC codes = N) or tokens;
    ``structure``: dot-bracket, pair table or list of 0-based (i, j) pairs (nested).
    ``pf=True`` gives the partition-function version of each loop (see the module docstring).
    """
    p = params if _is_numpy(params) else numpy_params(params)
    x = _tokens(sequence).tolist()
    n = len(x)
    pt = as_pair_table(structure, n)
    branches, _ = _children(pt, 0, n)
    loops = [LoopEnergy("exterior", None, tuple(branches), exterior_energy(p, x, branches))]
    for i in range(n):
        j = int(pt[i])
        if j <= i:
            continue
        inner, unpaired = _children(pt, i + 1, j)
        if not inner:
            loops.append(LoopEnergy("hairpin", (i, j), (), hairpin_energy(p, x, i, j, pf=pf)))
        elif len(inner) == 1:
            k, l = inner[0]
            kind, energy = interior_energy(p, x, i, j, k, l, pf=pf)
            loops.append(LoopEnergy(kind, (i, j), tuple(inner), energy))
        else:
            loops.append(LoopEnergy("multi", (i, j), tuple(inner), multiloop_energy(p, x, i, j, inner, unpaired)))
    return loops


def reference_free_energy(params, sequence, structure, *, pf: bool = False) -> float:
    """Free energy (kcal/mol) of ``structure`` on ``sequence``: the sum of its loop energies.

    Equals ViennaRNA's ``fold_compound(seq).eval_structure`` (default model) for ``pf=False``; with
    ``pf=True`` it is the energy whose Boltzmann factor ViennaRNA's partition function
    (``md.pf_smooth = 0``) gives the structure. +inf for non-canonical pairs and for loops that use
    a +inf entry. See the module docstring for the formulas.

    >>> from foldax.layers.energy_params import turner2004
    >>> round(reference_free_energy(turner2004(), "GCUUCGGC", [(0, 7), (1, 6)]), 6)  # UUCG tetraloop
    0.3
    """
    return float(sum(loop.energy for loop in reference_loop_energies(params, sequence, structure, pf=pf)))


def _is_numpy(params) -> bool:
    return (
        isinstance(params, dict) and isinstance(params.get("stack"), np.ndarray) and params["stack"].dtype == np.float64
    )


# --------------------------------------------------------------------------- #
# brute force over the Turner grammar's structures (short sequences)
# --------------------------------------------------------------------------- #


def enumerate_turner_structures(sequence, *, min_hairpin: int = 3, max_loop: int = MAX_LOOP):
    """Every structure of the Turner grammar on ``sequence``, as tuples of 0-based pairs.

    Nested, canonical pairs only (:data:`~foldax.layers.energy_params.PAIR_INDEX`), at least
    ``min_hairpin`` unpaired bases in every hairpin, at most ``max_loop`` unpaired bases in every
    bulge or interior loop (ViennaRNA's folding space with ``RNA.md()`` defaults). Exponential:
    for short sequences (n <= ~18).

    >>> structures = list(enumerate_turner_structures("GGGAAACCC"))
    >>> len(structures), ((0, 8), (1, 7), (2, 6)) in structures
    (20, True)
    """
    x = _tokens(sequence).tolist()
    n = len(x)
    memo: dict = {}

    def inside(i: int, j: int) -> list:
        """All structures on positions i..j (inclusive) as lists of pairs."""
        if j - i <= min_hairpin:
            return [()]
        if (i, j) in memo:
            return memo[(i, j)]
        out = list(inside(i + 1, j))  # i unpaired
        for k in range(i + min_hairpin + 1, j + 1):
            if PAIR_INDEX[x[i], x[k]] >= 0:
                for enclosed in inside(i + 1, k - 1):
                    for rest in inside(k + 1, j) if k < j else [()]:
                        out.append(((i, k),) + enclosed + rest)
        memo[(i, j)] = out
        return out

    for pairs in inside(0, n - 1) if n else [()]:
        if max_loop is None or _largest_interior_loop(pairs, n) <= max_loop:
            yield tuple(sorted(pairs))


def _largest_interior_loop(pairs, n: int) -> int:
    pt = np.full(n, -1)
    for i, j in pairs:
        pt[i], pt[j] = j, i
    largest = 0
    for i, j in pairs:
        inner, unpaired = _children(pt, i + 1, j)
        if len(inner) == 1:
            largest = max(largest, unpaired)
    return largest


def brute_force_ensemble_free_energy(params, sequence, *, pf: bool = True, phi=None) -> float:
    """``-kT ln sum_s exp(-(E(s) - kT sum_{(i,j) in s} phi[i, j]) / kT)`` over
    :func:`enumerate_turner_structures`, in kcal/mol (float64, log-sum-exp).

    With ``pf=True`` (default) E is the partition-function energy, so the result is ViennaRNA's
    ensemble free energy (``md.pf_smooth = 0``; with soft constraints ``fc.sc_add_bp(i+1, j+1, e)``
    for ``phi[i, j] = -e / kT``).
    """
    from foldax.layers.energy_params import KT

    KT = float(np.asarray(params["kT"])) if "kT" in params else KT  # noqa: N806 (parameters at another temperature)
    p = params if _is_numpy(params) else numpy_params(params)
    x = _tokens(sequence)
    phi = None if phi is None else np.asarray(phi, dtype=np.float64)
    energies = []
    for pairs in enumerate_turner_structures(x):
        energy = reference_free_energy(p, x, list(pairs), pf=pf)
        if phi is not None:
            energy -= KT * sum(phi[i, j] for i, j in pairs)
        energies.append(energy)
    energies = np.array(energies)
    lowest = energies.min()
    return float(lowest - KT * math.log(np.exp(-(energies - lowest) / KT).sum()))
