"""Turner 2004 nearest-neighbour energy parameters: the pytree, its data file and ViennaRNA ``.par`` files.

The parameters of the Turner 2004 model as ViennaRNA 2.x evaluates it (``RNA.md()`` defaults:
37 C, dangles=2, special hairpins, GU pairs, interior loops up to 30, hairpins of at least 3) are a
plain dict of float arrays in kcal/mol, every entry learnable:

=========================  ==============  =====================================================
key                        shape           meaning (``t`` = pair type, bases in token order)
=========================  ==============  =====================================================
``stack``                  [6, 6]          ``stack[t(i,j), t(l,k)]``: outer pair (i, j) stacked on
                                           inner pair (k, l), i < k < l < j; the inner pair is
                                           read from inside the loop, l before k (ViennaRNA's
                                           ``stack[type][rtype(type(k,l))]``).
``mismatch_hairpin``       [6, 5, 5]       ``[t(i,j), x[i+1], x[j-1]]`` for the pair closing a hairpin.
``mismatch_interior``      [6, 5, 5]       generic interior loops, both pairs (see below).
``mismatch_interior_1n``   [6, 5, 5]       1 x n interior loops (n >= 3).
``mismatch_interior_23``   [6, 5, 5]       2 x 3 interior loops.
``mismatch_multi``         [6, 5, 5]       ``[t(p,q), x[p-1], x[q+1]]`` for a stem seen from the
                                           multiloop (dangles=2), see below.
``mismatch_exterior``      [6, 5, 5]       the same for a stem in the exterior loop.
``dangle5``                [6, 5]          ``[t(p,q), x[p-1]]`` (a 5' dangle alone: exterior loop,
                                           stem at the 3' end of the sequence).
``dangle3``                [6, 5]          ``[t(p,q), x[q+1]]`` (a 3' dangle alone: exterior loop,
                                           stem at the 5' start of the sequence).
``int11``                  [6, 6, 5, 5]    ``[t(i,j), t(l,k), x[i+1], x[j-1]]``
``int21``                  [6, 6, 5, 5, 5] ``[t(i,j), t(l,k), x[i+1], x[l+1], x[j-1]]`` when
                                           k = i + 2, l = j - 3 (1 nt 5', 2 nt 3'); the 2 x 1 case
                                           (k = i + 3, l = j - 2) uses
                                           ``[t(l,k), t(i,j), x[l+1], x[i+1], x[k-1]]``.
``int22``                  [6,6,5,5,5,5]   ``[t(i,j), t(l,k), x[i+1], x[k-1], x[l+1], x[j-1]]``
``hairpin``                [31]            hairpin initiation by loop length 0..30
``bulge``                  [31]            bulge initiation by loop length 0..30
``interior``               [31]            interior loop initiation by total unpaired 0..30
``ml_base``                []              per unpaired nucleotide in a multiloop
``ml_closing``             []              per multiloop
``ml_intern``              []              per branch of a multiloop (closing pair included)
``ninio``                  []              asymmetry penalty per nucleotide |n1 - n2|
``max_ninio``              []              cap of the asymmetry penalty
``terminal_au``            []              AU/UA/GU/UG penalty for a helix end
``lxc``                    []              large-loop extrapolation: E(n) = E(30) + lxc ln(n/30)
``special_hairpins``       {str: []}       total energy of special tri-, tetra- and hexaloops,
                                           keyed by the loop's sequence including the closing pair
                                           (5, 6 or 8 letters over ACGU)
``kT`` (optional)          []              kT (kcal/mol) of the log-weights ``-E/kT``; present only
                                           in sets moved away from 37 C (``temperature=``, see
                                           :func:`turner2004`), not learned (its gradient is stopped)
=========================  ==============  =====================================================

Indices: bases follow :mod:`foldax.layers.alphabet` (``A=0 C=1 G=2 U=3 N=4``), pair types follow
:data:`PAIR_TYPES` (``CG=0 GC=1 GU=2 UG=3 AU=4 UA=5``, ViennaRNA's pair type minus one);
:data:`PAIR_INDEX` gives the type of ``(x_i, x_j)`` (-1 if they cannot pair; N pairs with nothing).

Mismatch conventions, exactly ViennaRNA's. A pair is always read in the direction of the loop it
is seen from, ``(p, q)`` with the loop running from ``p`` to ``q`` through the loop's interior:

* hairpin and interior loops, seen from inside: ``mismatch[t(p,q), x[p+1], x[q-1]]``. For the
  closing (outer) pair ``(i, j)`` that is ``[t(i,j), x[i+1], x[j-1]]``; for the inner pair
  ``(k, l)`` it is read as ``(l, k)``: ``[t(l,k), x[l+1], x[k-1]]``.
* multiloop and exterior loop, seen from outside the stem: ``mismatch[t(p,q), x[p-1], x[q+1]]``.
  A branch ``(p, q)`` of a multiloop or the exterior loop uses ``[t(p,q), x[p-1], x[q+1]]``; the
  pair ``(i, j)`` closing a multiloop is read as ``(j, i)``: ``[t(j,i), x[j-1], x[i+1]]``. With
  dangles=2 the neighbours are used whether or not they are paired. In the exterior loop a
  neighbour beyond the sequence end is absent: then ``dangle5[t, x[p-1]]`` (no 3' neighbour) or
  ``dangle3[t, x[q+1]]`` (no 5' neighbour) or nothing (neither) replaces the mismatch.

Entries ViennaRNA has as INF are ``+inf``: the loops that use them are forbidden. In Turner 2004
these are ``hairpin[0:3]``, ``bulge[0]`` and ``interior[0:2]``, which no structure of the Turner
grammar reaches; other sets have more (Andronescu 2007 ``interior[2:4]``, Langdon 2018 entries of
``int21``, ``int22`` and ``mismatch_interior_23``) and fewer (Langdon's ``hairpin[0:3]`` are finite:
the grammar's minimum hairpin of 3 is a rule of the grammar, not of the tables). No table holds
``-inf`` or NaN, so sums of entries are never NaN.

ViennaRNA clips ``mismatch_multi``, ``mismatch_exterior``, ``dangle5`` and ``dangle3`` at zero when it
prepares a parameter set (positive entries, e.g. in Langdon 2018, act as 0 in its eval and
partition function alike); :func:`load_parameter_file` applies that clip, so the tables hold the
energies ViennaRNA uses and every evaluator uses them as they are.

N entries: N (and every IUPAC code, see :func:`foldax.layers.encode`) is token 4 and is ViennaRNA's base
0. It pairs with nothing, but as a mismatch/dangle/loop neighbour it indexes the tables' N entries,
which carry ViennaRNA's values (for ``int22``, ViennaRNA derives them from the ACGU entries when a
file is read, as the most unfavourable value over the bases N stands for; this module does the same).

Temperature: ViennaRNA moves every energy to ``T`` from its enthalpy ``H`` as
``G(T) = H - (H - G(37 C)) T / T37`` (kelvin), truncated to integer dcal/mol; :func:`turner2004`,
:func:`load_parameter_file` (a file's own enthalpies) and :func:`at_temperature` do the same.

Data: :func:`turner2004` loads ``layers/data/rna_turner2004.json`` (made once by
``scripts/convert_vienna_params.py`` from ViennaRNA's own parameter set; provenance and citations
inside). :func:`load_parameter_file` reads ViennaRNA 2.0 ``.par`` files (Andronescu 2007,
Langdon 2018, ...), :func:`save_parameter_file` writes one that ViennaRNA reads.

>>> params = turner2004()
>>> G, C = 2, 1  # 5'-GC-3'/3'-CG-5': x[i] = G, x[k] = C, x[l] = G, x[j] = C
>>> round(float(params["stack"][PAIR_INDEX[G, C], PAIR_INDEX[G, C]]), 4)
-3.4
>>> round(float(params["special_hairpins"]["CUUCGG"]), 4)
3.7
>>> round(KT, 6)
0.616321
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "KT",
    "kt",
    "temperature_kt",
    "PAIR_TYPES",
    "PAIR_INDEX",
    "MAX_LOOP",
    "TABLE_SHAPES",
    "SCALAR_NAMES",
    "SPECIAL_HAIRPIN_LENGTHS",
    "turner2004",
    "at_temperature",
    "without_dangles",
    "DANGLE_TABLES",
    "load_parameter_file",
    "save_parameter_file",
    "parameters_from_string",
    "parameters_to_string",
    "check_energy_params",
    "CLIPPED_TABLES",
]

#: 0 C in K and the gas constant in cal/(mol K), as ViennaRNA has them (K0, GASCONST).
_K0, _GASCONST = 273.15, 1.98717
#: kT at 37 C in kcal/mol: (37 + 273.15) K x 1.98717 cal/(mol K) / 1000 (ViennaRNA's GASCONST, K0).
KT = (37.0 + _K0) * _GASCONST / 1000.0


def kt(temperature: float = 37.0) -> float:
    """kT in kcal/mol at ``temperature`` (degrees Celsius), as ViennaRNA computes it.

    >>> kt() == KT, round(kt(50.0), 6)
    (True, 0.642154)
    """
    return (float(temperature) + _K0) * _GASCONST / 1000.0


def temperature_kt(params) -> float | jnp.ndarray:
    """The kT (kcal/mol) that the log-weights ``-E/kT`` of Turner parameters use: their optional
    ``"kT"`` entry (set by ``turner2004(temperature=...)`` and ``load_parameter_file(...,
    temperature=...)``, not learned: its gradient is stopped), else :data:`KT` (37 C)."""
    if "kT" in params:
        return jax.lax.stop_gradient(jnp.asarray(params["kT"]))
    return KT

PAIR_TYPES = ("CG", "GC", "GU", "UG", "AU", "UA")
_TOKENS = "ACGUN"
#: ``PAIR_INDEX[x_i, x_j]``: the pair type of tokens (x_i, x_j), or -1 if they do not pair.
PAIR_INDEX = np.full((5, 5), -1, dtype=np.int32)
for _t, _name in enumerate(PAIR_TYPES):
    PAIR_INDEX[_TOKENS.index(_name[0]), _TOKENS.index(_name[1])] = _t
PAIR_INDEX.setflags(write=False)

#: Longest interior loop / bulge of the Turner grammar (total unpaired nucleotides), and the
#: largest loop length with a tabulated initiation energy.
MAX_LOOP = 30

TABLE_SHAPES = {
    "stack": (6, 6),
    "mismatch_hairpin": (6, 5, 5),
    "mismatch_interior": (6, 5, 5),
    "mismatch_interior_1n": (6, 5, 5),
    "mismatch_interior_23": (6, 5, 5),
    "mismatch_multi": (6, 5, 5),
    "mismatch_exterior": (6, 5, 5),
    "dangle5": (6, 5),
    "dangle3": (6, 5),
    "int11": (6, 6, 5, 5),
    "int21": (6, 6, 5, 5, 5),
    "int22": (6, 6, 5, 5, 5, 5),
    "hairpin": (MAX_LOOP + 1,),
    "bulge": (MAX_LOOP + 1,),
    "interior": (MAX_LOOP + 1,),
}
SCALAR_NAMES = ("ml_base", "ml_closing", "ml_intern", "ninio", "max_ninio", "terminal_au", "lxc")
#: The scalars with an enthalpy (``max_ninio`` is the same at every temperature).
_SCALAR_ENTHALPIES = ("ml_base", "ml_closing", "ml_intern", "ninio", "terminal_au", "lxc")
#: Special hairpin keys: 5 letters (triloop + closing pair), 6 (tetraloop), 8 (hexaloop).
SPECIAL_HAIRPIN_LENGTHS = {5: "Triloops", 6: "Tetraloops", 8: "Hexaloops"}

_DATA_FILE = "rna_turner2004.json"

# --------------------------------------------------------------------------- #
# ViennaRNA's layout ("raw"): energies in dcal/mol (float64, +inf for INF), pair types 0..7
# (0 = no pair, 1..6 = CG GC GU UG AU UA, 7 = non-standard), bases 0..4 (0 = N, 1..4 = ACGU).
# --------------------------------------------------------------------------- #

_NBPAIRS = 7
_VIENNA_INF = 10000000  # ViennaRNA's INF (dcal/mol)
_DEF = -50  # the 'DEF' token of ViennaRNA's reader
_NST = 0  # the 'NST' token
_LXC37_DCAL = 107.856  # ViennaRNA's lxc37, used by the reader's 'x' extrapolation
_MAX_SPECIAL_LOOPS = 40  # ViennaRNA's reader keeps at most 40 entries per special-hairpin list

# foldax index -> ViennaRNA index
_V_BASE = np.array([1, 2, 3, 4, 0])
_V_PAIR = np.array([1, 2, 3, 4, 5, 6])

# Which axes of each table are pair-type axes (P) and base axes (B).
_AXES = {
    "stack": "PP",
    "mismatch_hairpin": "PBB",
    "mismatch_interior": "PBB",
    "mismatch_interior_1n": "PBB",
    "mismatch_interior_23": "PBB",
    "mismatch_multi": "PBB",
    "mismatch_exterior": "PBB",
    "dangle5": "PB",
    "dangle3": "PB",
    "int11": "PPBB",
    "int21": "PPBBB",
    "int22": "PPBBBB",
}

# .par section name -> (table key, rows to read as (axis ranges in ViennaRNA indices), values per row).
# Mirrors ViennaRNA's reader: pair-type axes start at 1 ("shift"), int22 stops before the
# non-standard type and reads bases 1..4 only (its N entries are derived, see _update_nst).
_SECTIONS = {
    "stack": ("stack", (range(1, 8),), range(1, 8)),
    "mismatch_hairpin": ("mismatch_hairpin", (range(1, 8), range(5)), range(5)),
    "mismatch_internal": ("mismatch_interior", (range(1, 8), range(5)), range(5)),
    "mismatch_internal_1n": ("mismatch_interior_1n", (range(1, 8), range(5)), range(5)),
    "mismatch_internal_23": ("mismatch_interior_23", (range(1, 8), range(5)), range(5)),
    "mismatch_multi": ("mismatch_multi", (range(1, 8), range(5)), range(5)),
    "mismatch_exterior": ("mismatch_exterior", (range(1, 8), range(5)), range(5)),
    "dangle5": ("dangle5", (range(1, 8),), range(5)),
    "dangle3": ("dangle3", (range(1, 8),), range(5)),
    "int11": ("int11", (range(1, 8), range(1, 8), range(5)), range(5)),
    "int21": ("int21", (range(1, 8), range(1, 8), range(5), range(5)), range(5)),
    "int22": ("int22", (range(1, 7), range(1, 7), range(1, 5), range(1, 5), range(1, 5)), range(1, 5)),
}
_LOOP_SECTIONS = {"hairpin": "hairpin", "bulge": "bulge", "internal": "interior"}
_SCALAR_SECTIONS = ("ML_params", "NINIO", "Misc")
_SPECIAL_SECTIONS = {"Triloops": 5, "Tetraloops": 6, "Hexaloops": 8}
_KNOWN = (
    set(_SECTIONS)
    | set(_LOOP_SECTIONS)
    | set(_SCALAR_SECTIONS)
    | set(_SPECIAL_SECTIONS)
    | {name + "_enthalpies" for name in list(_SECTIONS) + list(_LOOP_SECTIONS)}
    | {"END"}
)
_HEADER = "## RNAfold parameter file v2.0"


def _raw_shape(key: str) -> tuple[int, ...]:
    return tuple(_NBPAIRS + 1 if a == "P" else 5 for a in _AXES[key])


def _vienna_index(key: str):
    return np.ix_(*[_V_PAIR if a == "P" else _V_BASE for a in _AXES[key]])


def _to_raw(params) -> dict:
    """foldax pytree (kcal/mol) -> ViennaRNA layout (dcal/mol, float64)."""
    check_energy_params(params)
    dcal = {key: np.asarray(params[key], dtype=np.float64) * 100.0 for key in list(TABLE_SHAPES) + list(SCALAR_NAMES)}
    dcal["special_hairpins"] = {
        seq: float(np.asarray(e, dtype=np.float64)) * 100.0 for seq, e in params["special_hairpins"].items()
    }
    return _layout_to_raw(dcal)


def _layout_to_raw(dcal: dict) -> dict:
    """foldax layout in dcal/mol -> ViennaRNA layout.

    Entries the foldax layout lacks (pair type 0 and the non-standard type 7) are filled as
    ViennaRNA fills the non-standard entries it derives: type 0 with INF, type 7 with the maximum
    over the six canonical types (axis by axis, so [7, 7] is the maximum over both).
    """
    raw: dict = {}
    for key, axes in _AXES.items():
        table = np.full(_raw_shape(key), np.inf)
        table[_vienna_index(key)] = dcal[key]
        for axis, kind in enumerate(axes):
            if kind == "P":
                idx = [slice(None)] * table.ndim
                idx[axis] = _NBPAIRS
                table[tuple(idx)] = np.take(table, np.arange(1, 7), axis=axis).max(axis=axis)
        raw[key] = table
    for key in ("hairpin", "bulge", "interior"):
        raw[key] = np.array(dcal[key], dtype=np.float64)
    for key in SCALAR_NAMES:
        raw[key] = float(dcal[key])
    raw["special_hairpins"] = {seq: float(e) for seq, e in dcal["special_hairpins"].items()}
    return raw


def _from_raw(raw: dict, dtype) -> dict:
    """ViennaRNA layout (dcal/mol) -> foldax pytree (kcal/mol) of ``dtype`` arrays."""
    out = {}
    for key in TABLE_SHAPES:
        table = raw[key][_vienna_index(key)] if key in _AXES else raw[key]
        out[key] = jnp.asarray(_dcal_to_kcal(table), dtype=dtype)
    for key in SCALAR_NAMES:
        out[key] = jnp.asarray(_dcal_to_kcal(raw[key]), dtype=dtype)
    out["special_hairpins"] = {
        seq: jnp.asarray(_dcal_to_kcal(e), dtype=dtype) for seq, e in raw["special_hairpins"].items()
    }
    return out


def _dcal_to_kcal(values):
    values = np.asarray(values, dtype=np.float64)
    return np.where(values >= _VIENNA_INF, np.inf, values / 100.0)


# --------------------------------------------------------------------------- #
# the packaged Turner 2004 set
# --------------------------------------------------------------------------- #

_TURNER_RAW_CACHE: dict = {}


def _turner2004_raw(*, enthalpies: bool = False) -> dict:
    """Turner 2004 in ViennaRNA layout, from the packaged data file (cached, returned as a copy):
    its energies at 37 C, or with ``enthalpies`` its enthalpies."""
    if not _TURNER_RAW_CACHE:
        text = resources.files("foldax.layers").joinpath("data", _DATA_FILE).read_text(encoding="utf-8")
        data = json.loads(text)
        _TURNER_RAW_CACHE["energies"] = _raw_from_data(data, _DATA_FILE)
        if "enthalpies" not in data:
            raise ValueError(f"{_DATA_FILE}: no 'enthalpies' (rerun scripts/convert_vienna_params.py)")
        _TURNER_RAW_CACHE["enthalpies"] = _enthalpies_from_data(data, _DATA_FILE)
    return _copy_raw(_TURNER_RAW_CACHE["enthalpies" if enthalpies else "energies"])


def _enthalpies_from_data(data: dict, name: str) -> dict:
    heat = data["enthalpies"]
    scalars = {**heat["scalars"], "max_ninio": data["scalars"]["max_ninio"]}  # (it has no enthalpy)
    return _raw_from_data({"format": data["format"], **heat, "scalars": scalars}, f"{name} (enthalpies)")


def _from_data_file(data: dict, name: str, dtype=jnp.float32, temperature: float = 37.0) -> dict:
    """The pytree of a parsed data file of the packaged format (``rna_turner2004.json``'s), at
    ``temperature`` from its own enthalpies (Turner 2004's where it has none)."""
    temperature = _check_temperature(temperature)
    raw = _raw_from_data(data, name)
    if temperature != 37.0:
        heat = _enthalpies_from_data(data, name) if "enthalpies" in data else _turner2004_raw(enthalpies=True)
        _at_temperature(raw, heat, temperature, truncate=True)
    return _finish(raw, dtype, temperature)


def _copy_raw(raw: dict) -> dict:
    return {k: (v.copy() if isinstance(v, (np.ndarray, dict)) else v) for k, v in raw.items()}


def _raw_from_data(data: dict, name: str) -> dict:
    """Reads the packaged JSON (foldax layout, integer dcal/mol, null = INF) into ViennaRNA layout."""
    if data.get("format") != "foldax-energy-params-1":
        raise ValueError(f"{name}: unknown format {data.get('format')!r} (expected 'foldax-energy-params-1')")
    dcal = {}
    for key, shape in TABLE_SHAPES.items():
        table = np.array(_nulls_to_inf(data["tables"][key]), dtype=np.float64)
        if table.shape != shape:
            raise ValueError(f"{name}: table {key!r} has shape {table.shape}, expected {shape}")
        dcal[key] = table
    for key in SCALAR_NAMES:
        dcal[key] = float(data["scalars"][key])
    dcal["special_hairpins"] = {seq: float(e) for seq, e in data["special_hairpins"].items()}
    return _layout_to_raw(dcal)


def _nulls_to_inf(nested):
    if isinstance(nested, list):
        return [_nulls_to_inf(v) for v in nested]
    return np.inf if nested is None else nested


def _at_temperature(raw: dict, enthalpies: dict, temperature: float, *, truncate: bool) -> dict:
    """ViennaRNA's temperature rescaling of a ViennaRNA-layout set (dcal/mol; in place).

    Every energy becomes ``G(T) = H - (H - G(37 C)) T / T37`` (T in K; ``lxc``, whose enthalpy is 0,
    scales with T; ``max_ninio`` stays), then the tables of :data:`CLIPPED_TABLES` are clipped at 0.
    ``truncate``: toward zero to integer dcal/mol, as ViennaRNA does (its energy evaluation, MFE and
    partition function all use the integer set; only ``lxc`` stays a real number). INF stays INF.
    """
    factor = (float(temperature) + _K0) / (37.0 + _K0)

    def rescale(g, h, *, integer=truncate):
        # An INF energy, or a finite one with an INF enthalpy (Turner 1999's interior[2:4], which no
        # loop reads: 1x1 and 1x2 loops use int11 and int21), is INF: ViennaRNA's arithmetic on its
        # INF sentinel would make the latter a huge bonus or penalty.
        g, h = np.asarray(g, np.float64), np.asarray(h, np.float64)
        with np.errstate(invalid="ignore"):
            out = np.where(np.isinf(g) | np.isinf(h), np.inf, h - (h - g) * factor)
        return np.trunc(out) if integer else out

    for key in list(_AXES) + ["hairpin", "bulge", "interior"]:
        raw[key] = rescale(raw[key], enthalpies[key])
    for key in _SCALAR_ENTHALPIES:
        raw[key] = float(rescale(raw[key], enthalpies[key], integer=truncate and key != "lxc"))
    missing = sorted(set(raw["special_hairpins"]) - set(enthalpies["special_hairpins"]))
    if missing:
        raise ValueError(f"cannot rescale to another temperature: special hairpins {missing} have no enthalpy")
    raw["special_hairpins"] = {seq: float(rescale(e, enthalpies["special_hairpins"][seq]))
                               for seq, e in raw["special_hairpins"].items()}
    _clip_dangles(raw)
    return raw


def at_temperature(params, temperature: float, *, truncate: bool = True, enthalpies=None) -> dict:
    """Parameters at 37 C moved to ``temperature`` (degrees Celsius) as ViennaRNA rescales them.

    ``params``: a Turner-layout pytree at 37 C (e.g. one trained from :func:`turner2004`); its
    ``"kT"`` entry, if any, must be 37 C's. ``enthalpies``: a pytree of the same layout (kcal/mol),
    default Turner 2004's, the only enthalpies foldax ships: a set fitted or trained at 37 C has none
    of its own. ``truncate`` as in :func:`turner2004`. At 37 C the parameters are returned unchanged.
    A ``.par`` file's own enthalpies are :func:`load_parameter_file`'s (``temperature=``).

    >>> moved = at_temperature(turner2004(), 50.0)
    >>> bool((moved["stack"] == turner2004(temperature=50.0)["stack"]).all())
    True
    """
    temperature = _check_temperature(temperature)
    if "kT" in params and abs(float(np.asarray(params["kT"])) - KT) > 1e-6:
        raise ValueError(f"at_temperature moves parameters at 37 C; these are at kT = {float(params['kT'])} kcal/mol")
    if temperature == 37.0:
        return dict(params)
    dtype = jnp.result_type(*[np.asarray(v).dtype for k, v in params.items() if k not in ("special_hairpins", "kT")])
    raw = _to_raw(params)
    heat = _turner2004_raw(enthalpies=True) if enthalpies is None else _to_raw(enthalpies)
    return _finish(_at_temperature(raw, heat, temperature, truncate=truncate), dtype, temperature)


#: The tables of the stems' neighbours in multiloops and the exterior loop (RNAfold's ``-d``).
DANGLE_TABLES = ("mismatch_multi", "mismatch_exterior", "dangle5", "dangle3")


def without_dangles(params) -> dict:
    """The parameters of ViennaRNA's ``dangles = 0`` model (``RNAfold -d0``): no mismatch or dangle
    energy for a stem in a multiloop or the exterior loop (its terminal AU/GU stays). The grammar
    reads neighbours only through :data:`DANGLE_TABLES`, so they are set to 0.

    >>> p = without_dangles(turner2004())
    >>> float(abs(p["mismatch_exterior"]).max()), round(float(p["stack"][0, 0]), 4)
    (0.0, -2.4)
    """
    check_energy_params(params)
    return {**params, **{key: jnp.zeros_like(jnp.asarray(params[key])) for key in DANGLE_TABLES}}


def _finish(raw: dict, dtype, temperature: float) -> dict:
    params = _from_raw(raw, dtype)
    if float(temperature) != 37.0:
        params["kT"] = jnp.asarray(kt(temperature), dtype=dtype)
    return params


def _check_temperature(temperature) -> float:
    value = float(temperature)
    if not math.isfinite(value) or value <= -_K0:
        raise ValueError(f"temperature must be a finite number of degrees Celsius above -{_K0}, got {temperature!r}")
    return value


def turner2004(dtype=jnp.float32, *, temperature: float = 37.0, truncate: bool = True) -> dict:
    """The Turner 2004 parameters (ViennaRNA 2.x's default set) as a pytree of ``dtype`` arrays.

    kcal/mol at 37 C, in the layout described in the module docstring; ``dtype`` defaults to
    float32. Every call returns fresh arrays.

    ``temperature`` (degrees Celsius, like ``RNAfold -T``): the free energies at that temperature,
    from the set's enthalpies as ViennaRNA rescales them (``G(T) = H - (H - G37) T / T37``), plus the
    entry ``"kT"`` (:func:`kt`) that every log-weight ``-E/kT`` then uses. ``truncate`` (default):
    each rescaled energy truncated toward zero to integer dcal/mol, as ViennaRNA's parameter sets hold
    them (its ``eval_structure``, MFE and partition function alike); ``False`` keeps the exact values.

    >>> p = turner2004()
    >>> p["int22"].shape, [round(float(p[k]), 5) for k in ("ml_closing", "terminal_au", "lxc")]
    ((6, 6, 5, 5, 5, 5), [9.3, 0.5, 1.07856])
    >>> float(p["hairpin"][0])
    inf
    >>> hot = turner2004(temperature=50.0)
    >>> round(float(hot["stack"][0, 0]), 4), round(float(hot["kT"]), 6)
    (-2.05, 0.642154)
    >>> round(float(turner2004(temperature=50.0, truncate=False)["stack"][0, 0]), 4)
    -2.0563
    """
    temperature = _check_temperature(temperature)
    raw = _turner2004_raw()
    if temperature != 37.0:
        raw = _at_temperature(raw, _turner2004_raw(enthalpies=True), temperature, truncate=truncate)
    return _finish(raw, dtype, temperature)


def check_energy_params(params) -> None:
    """Raises ``ValueError`` naming the first key that is missing or has the wrong shape.

    >>> p = turner2004(); p["stack"] = p["stack"][:5]
    >>> check_energy_params(p)
    Traceback (most recent call last):
    ...
    ValueError: energy parameter 'stack' has shape (5, 6), expected (6, 6)
    """
    if not isinstance(params, dict):
        raise ValueError(f"energy parameters must be a dict, got {type(params).__name__}")
    for key, shape in list(TABLE_SHAPES.items()) + [(k, ()) for k in SCALAR_NAMES]:
        if key not in params:
            raise ValueError(f"energy parameters lack {key!r}")
        got = tuple(np.shape(params[key]))
        if got != shape:
            raise ValueError(f"energy parameter {key!r} has shape {got}, expected {shape}")
    if "kT" in params and np.shape(params["kT"]) != ():
        raise ValueError(f"energy parameter 'kT' has shape {np.shape(params['kT'])}, expected a scalar (kcal/mol)")
    special = params.get("special_hairpins")
    if not isinstance(special, dict):
        raise ValueError("energy parameters lack the dict 'special_hairpins'")
    for seq, energy in special.items():
        if not isinstance(seq, str) or len(seq) not in SPECIAL_HAIRPIN_LENGTHS or set(seq) - set("ACGU"):
            raise ValueError(
                f"special hairpin key {seq!r}: expected 5, 6 or 8 letters over ACGU (the loop with its closing pair)"
            )
        if np.shape(energy) != ():
            raise ValueError(f"special hairpin {seq!r} has shape {np.shape(energy)}, expected a scalar")


# --------------------------------------------------------------------------- #
# reading .par files
# --------------------------------------------------------------------------- #


class _Lines:
    """The lines of a parameter file; lines inside sections are read without their comments.

    Lines before the first section are free text (ViennaRNA reads nothing there).
    """

    def __init__(self, text: str, name: str):
        self.name = name
        self.raw = text.splitlines()

    def tokens(self, number: int) -> list[str]:
        """The whitespace-separated tokens of line ``number`` (1-based), comments removed."""
        return self._strip_comments(self.raw[number - 1], number).split()

    def _strip_comments(self, line: str, number: int) -> str:
        out = []
        while True:
            start = line.find("/*")
            if start < 0:
                out.append(line)
                return "".join(out)
            end = line.find("*/", start + 2)
            if end < 0:
                raise self.error(number, "unclosed comment '/*' (comments must close on the same line)")
            out.append(line[:start] + " ")
            line = line[end + 2 :]

    def error(self, number: int, message: str) -> ValueError:
        return ValueError(f"{self.name} line {number}: {message}")


def _section_name(line: str) -> str | None:
    """The identifier of a section header ``# name`` (ViennaRNA: a line starting with '#')."""
    if not line.startswith("#"):
        return None
    words = line[1:].split()
    return words[0] if words else ""


def _parse_value(token: str, lines: _Lines, number: int, section: str) -> float | str:
    """One value token: an integer (dcal/mol), INF, DEF (-50), NST (0), or '*' / 'x' (returned as is)."""
    if token.startswith("*"):
        return "*"
    if token.startswith("x"):
        return "x"
    if token == "INF":
        return np.inf
    if token == "DEF":
        return float(_DEF)
    if token == "NST":
        return float(_NST)
    if re.fullmatch(r"[+-]?\d+", token):
        return float(int(token))
    raise lines.error(
        number,
        f"section {section!r}: cannot read value {token!r} (expected an integer in dcal/mol, INF, DEF, NST, '*' or 'x')",
    )


def parameters_from_string(text: str, *, name: str = "<string>", base=None, dtype=jnp.float32,
                           temperature: float = 37.0, truncate: bool = True) -> dict:
    """Parses the text of a ViennaRNA 2.0 parameter file; see :func:`load_parameter_file`."""
    temperature = _check_temperature(temperature)
    raw = _turner2004_raw() if base is None else _to_raw(base)
    enthalpies = _turner2004_raw(enthalpies=True)
    _parse_into(raw, text, name, enthalpies)
    if temperature != 37.0:
        _at_temperature(raw, enthalpies, temperature, truncate=truncate)  # (it clips, from unclipped energies)
    _clip_dangles(raw)
    return _finish(raw, dtype, temperature)


#: Tables ViennaRNA clips at zero when it prepares parameters ("must be <= 0"), for its energy
#: evaluation and (with pf_smooth = 0) its partition function alike.
CLIPPED_TABLES = ("mismatch_multi", "mismatch_exterior", "dangle5", "dangle3")


def _clip_dangles(raw: dict) -> None:
    for key in CLIPPED_TABLES:
        raw[key] = np.minimum(raw[key], 0.0)


def _parse_into(raw: dict, text: str, name: str, enthalpies: dict | None = None) -> None:
    """Overwrites the ViennaRNA-layout tables ``raw`` with what the file text sets, and ``enthalpies``
    (the same layout, or None: checked for shape, then dropped) with what its enthalpy values set."""
    lines = _Lines(text, name)
    if not lines.raw or not lines.raw[0].startswith(_HEADER):
        raise lines.error(1, f"not a ViennaRNA 2.0 parameter file (the first line must be {_HEADER!r})")
    headers = [(n, _section_name(line)) for n, line in enumerate(lines.raw, start=1) if _section_name(line) is not None]
    headers = [(n, s) for n, s in headers if n > 1]
    if enthalpies is None:
        enthalpies = _copy_raw(raw)  # checked for shape, then dropped
    seen: dict = {}
    for index, (number, section) in enumerate(headers):
        end = headers[index + 1][0] - 1 if index + 1 < len(headers) else len(lines.raw)
        body = range(number + 1, end + 1)  # 1-based line numbers of the section's body
        if re.match(r"(mismatch_)?interior", section):  # deprecated names ViennaRNA still reads
            section = section.replace("interior", "internal", 1)
        if section in seen and section != "END":
            raise lines.error(number, f"section {section!r} appears twice (first at line {seen[section]})")
        seen[section] = number
        target = raw
        if section.endswith("_enthalpies") and section in _KNOWN:
            section, target = section[: -len("_enthalpies")], enthalpies
        if section in _SECTIONS:
            _read_table(target, section, body, lines, number)
        elif section in _LOOP_SECTIONS:
            _read_loop_table(target, section, body, lines, number)
        elif section in _SCALAR_SECTIONS:  # (energy, enthalpy) pairs
            _read_scalars(raw, section, body, lines, number, enthalpies)
        elif section in _SPECIAL_SECTIONS:  # 'SEQUENCE energy enthalpy' lines
            _read_special(raw, section, body, lines, number, enthalpies)
        elif section != "END":
            warnings.warn(f"{name} line {number}: unknown section {section!r} ignored", stacklevel=4)


def _data_rows(body, lines: _Lines):
    """(line number, tokens) of the non-blank lines of a section body."""
    for number in body:
        tokens = lines.tokens(number)
        if tokens:
            yield number, tokens


def _read_table(raw: dict, section: str, body, lines: _Lines, header: int) -> None:
    key, row_axes, columns = _SECTIONS[section]
    rows = [tuple(index) for index in np.ndindex(*[len(r) for r in row_axes])]
    width = len(columns)
    table = raw[key]
    data = list(_data_rows(body, lines))
    for row, (number, tokens) in zip(rows, data):
        if len(tokens) != width:
            raise lines.error(number, f"section {section!r} expects {width} values per row, got {len(tokens)}")
        index = tuple(r[i] for r, i in zip(row_axes, row))
        for column, token in zip(columns, tokens):
            value = _parse_value(token, lines, number, section)
            if value == "x":
                raise lines.error(
                    number, f"section {section!r}: 'x' (extrapolation) is only allowed in loop-length tables"
                )
            if value != "*":
                table[index + (column,)] = value
    if len(data) < len(rows):
        last = data[-1][0] if data else header
        raise lines.error(last, f"section {section!r} ends after {len(data)} of {len(rows)} rows ({width} values each)")
    if len(data) > len(rows):
        raise lines.error(data[len(rows)][0], f"section {section!r} has more than {len(rows)} rows")
    if key == "int22":
        _update_nst(table)


def _read_values(section: str, body, lines: _Lines):
    """All value tokens of a section body as (line number, token)."""
    return [(number, token) for number, tokens in _data_rows(body, lines) for token in tokens]


def _read_loop_table(raw: dict, section: str, body, lines: _Lines, header: int) -> None:
    key = _LOOP_SECTIONS[section]
    size = MAX_LOOP + 1
    values = _read_values(section, body, lines)
    if len(values) != size:
        number = values[size][0] if len(values) > size else (values[-1][0] if values else header)
        raise lines.error(number, f"section {section!r} expects {size} values, got {len(values)}")
    table = raw[key]
    last = None
    for i, (number, token) in enumerate(values):
        value = _parse_value(token, lines, number, section)
        if value == "*":
            continue
        if value == "x":  # ViennaRNA: extrapolate from the last number given explicitly
            if last is None:
                raise lines.error(number, f"section {section!r}: 'x' needs an explicit value before it")
            value = table[last] + int(0.5 + _LXC37_DCAL * math.log(i / last))
        elif token not in ("INF", "DEF", "NST"):
            last = i
        table[i] = value


def _read_scalars(raw: dict, section: str, body, lines: _Lines, header: int, enthalpies: dict) -> None:
    values = _read_values(section, body, lines)
    expected = {"ML_params": (6, 6), "NINIO": (3, 3), "Misc": (4, 6)}[section]
    if not expected[0] <= len(values) <= expected[1]:
        number = values[-1][0] if values else header
        want = f"{expected[0]}" if expected[0] == expected[1] else f"{expected[0]} to {expected[1]}"
        raise lines.error(number, f"section {section!r} expects {want} values, got {len(values)}")
    parsed = []
    for i, (number, token) in enumerate(values):
        if section == "Misc" and i == 4:  # lxc, written by ViennaRNA as a decimal (dcal/mol)
            try:
                parsed.append(float(token))
            except ValueError:
                raise lines.error(number, f"section 'Misc': cannot read lxc {token!r}") from None
            continue
        value = _parse_value(token, lines, number, section)
        if value == "x":
            raise lines.error(number, f"section {section!r}: 'x' is only allowed in loop-length tables")
        parsed.append(value)
    # (energy, enthalpy) pairs; '*' keeps the current value. max_ninio has no enthalpy (ViennaRNA
    # does not rescale it), and lxc's is 0 in every set (it is scaled by T / 37 C as an entropy).
    targets = {
        "ML_params": {0: "ml_base", 2: "ml_closing", 4: "ml_intern"},
        "NINIO": {0: "ninio", 2: "max_ninio"},
        "Misc": {2: "terminal_au", 4: "lxc"},
    }[section]
    for position, key in targets.items():
        if position < len(parsed) and parsed[position] != "*":
            raw[key] = parsed[position]
        if key in _SCALAR_ENTHALPIES and position + 1 < len(parsed) and parsed[position + 1] != "*":
            enthalpies[key] = parsed[position + 1]


def _read_special(raw: dict, section: str, body, lines: _Lines, header: int, enthalpies: dict) -> None:
    """A special-hairpin list: consecutive 'SEQUENCE energy enthalpy' lines right after the header.

    ViennaRNA stops reading at the first other line (blank, or comment only) and silently ignores
    entries after it; here such entries are an error. The list replaces the current one.
    """
    length = _SPECIAL_SECTIONS[section]
    entries: dict = {}
    entry_enthalpies: dict = {}
    count = 0
    listing = True
    for number in body:
        tokens = lines.tokens(number)
        if not tokens:
            listing = False
            continue
        if not listing:
            raise lines.error(
                number, f"section {section!r}: entry after a blank or comment line (ViennaRNA would ignore it)"
            )
        if len(tokens) != 3:
            raise lines.error(
                number, f"section {section!r} expects 'SEQUENCE energy enthalpy', got {len(tokens)} fields"
            )
        seq, energy, enthalpy = tokens
        seq = seq.replace("T", "U")  # DNA sets list T; foldax reads T as U
        if len(seq) != length or set(seq) - set("ACGU"):
            raise lines.error(number, f"section {section!r}: {tokens[0]!r} is not {length} letters over ACGU(T)")
        value = _parse_value(energy, lines, number, section)
        heat = _parse_value(enthalpy, lines, number, section)
        if isinstance(value, str):
            raise lines.error(number, f"section {section!r}: cannot read energy {energy!r}")
        if isinstance(heat, str):
            raise lines.error(number, f"section {section!r}: cannot read enthalpy {enthalpy!r}")
        entries.setdefault(seq, value)  # ViennaRNA's lookup finds the first occurrence
        entry_enthalpies.setdefault(seq, heat)
        count += 1
        if count > _MAX_SPECIAL_LOOPS:
            raise lines.error(
                number, f"section {section!r} has more than {_MAX_SPECIAL_LOOPS} entries (ViennaRNA's limit)"
            )
    for target, new in ((raw, entries), (enthalpies, entry_enthalpies)):
        special = {seq: e for seq, e in target["special_hairpins"].items() if len(seq) != length}
        special.update(new)
        target["special_hairpins"] = special


def _update_nst(table: np.ndarray) -> None:
    """ViennaRNA's ``update_nst``: int22 entries with N (base 0) and with the non-standard pair type 7.

    The entry with one or more N is the maximum over A, C, G, U in those positions; the loops
    below follow ViennaRNA's order, so that ties and the positions mixed in each step agree.
    """
    a = table
    P = range(1, _NBPAIRS)
    B = range(1, 5)
    for i in P:
        for j in P:
            for k in B:
                for l in B:
                    for m in B:
                        a[i, j, k, l, m, 0] = max(a[i, j, k, l, m, n] for n in B)
                        a[i, j, k, l, 0, m] = max(a[i, j, k, l, n, m] for n in B)
                        a[i, j, k, 0, l, m] = max(a[i, j, k, n, l, m] for n in B)
                        a[i, j, 0, k, l, m] = max(a[i, j, n, k, l, m] for n in B)
    for i in P:
        for j in P:
            for k in B:
                for l in B:
                    a[i, j, k, l, 0, 0] = max(a[i, j, k, l, m, 0] for m in B)
                    a[i, j, k, 0, 0, l] = max(a[i, j, k, m, 0, l] for m in B)
                    a[i, j, 0, 0, k, l] = max(a[i, j, m, 0, k, l] for m in B)
                    a[i, j, k, 0, l, 0] = max(a[i, j, k, 0, l, m] for m in B)
                    a[i, j, 0, k, 0, l] = max(a[i, j, 0, k, m, l] for m in B)
                    a[i, j, 0, k, l, 0] = max(a[i, j, 0, k, l, m] for m in B)
    for i in P:
        for j in P:
            for k in B:
                a[i, j, k, 0, 0, 0] = max(a[i, j, k, l, 0, 0] for l in B)
                a[i, j, 0, k, 0, 0] = max(a[i, j, 0, k, l, 0] for l in B)
                a[i, j, 0, 0, k, 0] = max(a[i, j, 0, 0, k, l] for l in B)
                a[i, j, 0, 0, 0, k] = max(a[i, j, 0, 0, l, k] for l in B)
    for i in P:
        for j in P:
            a[i, j, 0, 0, 0, 0] = max(a[i, j, k, 0, 0, 0] for k in B)
    a[1:_NBPAIRS, _NBPAIRS] = a[1:_NBPAIRS, 1:_NBPAIRS].max(axis=1)
    a[_NBPAIRS, 1:_NBPAIRS] = a[1:_NBPAIRS, 1:_NBPAIRS].max(axis=0)
    a[_NBPAIRS, _NBPAIRS] = a[_NBPAIRS, 1:_NBPAIRS].max(axis=0)


def load_parameter_file(path, *, base=None, dtype=jnp.float32, temperature: float = 37.0,
                        truncate: bool = True) -> dict:
    """Reads a ViennaRNA 2.0 ``.par`` parameter file into the parameter pytree.

    The format is the one ``RNA.params_save`` writes and ViennaRNA's ``misc/rna_*.par`` use:
    a first line ``## RNAfold parameter file v2.0``, then sections ``# name`` (stack,
    mismatch_hairpin, mismatch_internal[_1n|_23], mismatch_multi, mismatch_exterior, dangle5,
    dangle3, int11, int21, int22, hairpin, bulge, internal, ML_params, NINIO, Misc, Triloops,
    Tetraloops, Hexaloops, END, and the ``*_enthalpies`` sections, which only matter away from
    37 C: ``temperature`` and ``truncate`` as in :func:`turner2004`; enthalpies the file does not set
    are Turner 2004's) holding integers in dcal/mol, ``INF``, ``DEF`` (-50), ``NST`` (0), ``*``
    (keep the current value) and, in loop-length tables, ``x`` (extrapolate as ViennaRNA does);
    ``/* ... */`` comments anywhere on a line.

    As in ViennaRNA, sections missing from the file keep the values of ``base`` (default: Turner
    2004, what a fresh ViennaRNA holds), a special-hairpin section replaces that whole list, the
    N entries of int22 are recomputed from its ACGU entries, and positive entries of
    :data:`CLIPPED_TABLES` (mismatch_multi, mismatch_exterior, dangle5, dangle3) are set to 0, as
    ViennaRNA's parameter preparation does: the pytree holds the energies ViennaRNA uses. Unlike
    ViennaRNA, a file that
    does not have exactly the expected shape (rows of the right width, the right number of rows
    or values, readable tokens) is rejected with a ``ValueError`` naming the file and line, as is
    a repeated section; an unknown section gives a warning. ``Misc`` may carry lxc as a fifth
    value (ViennaRNA writes it but its reader ignores it and always uses 107.856); it is read here.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.par"
    >>> _ = path.write_text("## RNAfold parameter file v2.0\\n# NINIO\\n 50 0 250\\n")
    >>> p = load_parameter_file(path)
    >>> [round(float(p[k]), 4) for k in ("ninio", "max_ninio", "ml_closing")]
    [0.5, 2.5, 9.3]
    >>> _ = path.write_text("## RNAfold parameter file v2.0\\n# stack\\n -240 -330 -210\\n")
    >>> load_parameter_file(path)
    Traceback (most recent call last):
    ...
    ValueError: tiny.par line 3: section 'stack' expects 7 values per row, got 3
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    return parameters_from_string(text, name=os.path.basename(path), base=base, dtype=dtype,
                                  temperature=temperature, truncate=truncate)


# --------------------------------------------------------------------------- #
# writing .par files
# --------------------------------------------------------------------------- #


def _format_value(value: float) -> str:
    """An integer dcal/mol value as ViennaRNA writes it (``INF`` for +inf or its INF sentinel)."""
    if value == np.inf or value >= _VIENNA_INF:
        return "   INF"
    return f"{int(value):5d}"


def _warn_lossy(ints: dict) -> None:
    """Warns about what a .par file cannot carry (ViennaRNA would read other values)."""
    positive = [key for key in CLIPPED_TABLES if (ints[key][1:7] > 0).any()]
    if positive:
        warnings.warn(
            f"{', '.join(positive)} hold positive energies; ViennaRNA clips these tables at 0 when it reads the file",
            stacklevel=3,
        )
    derived = ints["int22"].copy()
    _update_nst(derived)
    if not np.array_equal(derived[1:7, 1:7], ints["int22"][1:7, 1:7]):
        warnings.warn(
            "int22 entries with N differ from the maximum over ACGU; the .par format does not store "
            "them (ViennaRNA and load_parameter_file derive them from the ACGU entries)",
            stacklevel=3,
        )


def _dcal_integers(raw: dict) -> dict:
    """Rounds every energy to integer dcal/mol (the file format); rejects NaN and -inf."""
    out = {}
    for key, value in raw.items():
        if key in ("special_hairpins", "lxc"):
            continue
        array = np.asarray(value, dtype=np.float64)
        if np.isnan(array).any() or (array == -np.inf).any():
            raise ValueError(f"cannot save energy parameter {key!r}: it holds NaN or -inf")
        out[key] = np.where(np.isinf(array), np.inf, np.rint(array))
    return out


def parameters_to_string(params, *, comment: str | None = None) -> str:
    """The text of a ViennaRNA 2.0 parameter file for ``params``; see :func:`save_parameter_file`."""
    if "kT" in params and abs(float(np.asarray(params["kT"])) - KT) > 1e-6:
        raise ValueError(f"cannot save energies at kT = {float(np.asarray(params['kT'])):.6f} kcal/mol as a .par file: "
                         "its energies are at 37 C (save the set at 37 C; RNAfold -T moves it)")
    raw = _to_raw(params)
    ints = _dcal_integers(raw)
    _warn_lossy(ints)
    special = raw["special_hairpins"]
    for seq, e in special.items():
        if not np.isfinite(e):
            raise ValueError(f"cannot save special hairpin {seq!r}: energy {e / 100} is not finite")
    for length, section in SPECIAL_HAIRPIN_LENGTHS.items():
        count = sum(1 for seq in special if len(seq) == length)
        if count > _MAX_SPECIAL_LOOPS:
            raise ValueError(f"cannot save {count} {section}: ViennaRNA reads at most {_MAX_SPECIAL_LOOPS}")
    pnames = ("NP", "CG", "GC", "GU", "UG", "AU", "UA", " @")
    bnames = "@ACGU"
    out = [_HEADER]
    if comment:
        for line in comment.splitlines():
            out.append(f"/* {line.replace('*/', '* /')} */")
    note = (
        "written by foldax (layers.energy_params.save_parameter_file): energies at 37 C in dcal/mol; "
        "enthalpies equal the energies (no temperature dependence)"
    )
    out.append(f"/* {note} */")

    def block(title, rows, head=None):
        for suffix in ("", "_enthalpies"):
            out.append("")
            out.append(f"# {title}{suffix}")
            if head:
                out.append(head)
            for row in rows:
                if isinstance(row, str):
                    out.append(row)
                else:
                    out.append(" ".join(_format_value(v) for v in row))

    block("stack", [ints["stack"][p, 1:] for p in range(1, 8)], "/*  CG    GC    GU    UG    AU    UA    @  */")
    for section, key in (
        ("mismatch_hairpin", "mismatch_hairpin"),
        ("mismatch_internal", "mismatch_interior"),
        ("mismatch_internal_1n", "mismatch_interior_1n"),
        ("mismatch_internal_23", "mismatch_interior_23"),
        ("mismatch_multi", "mismatch_multi"),
        ("mismatch_exterior", "mismatch_exterior"),
    ):
        rows = []
        for p in range(1, 8):
            for i in range(5):
                rows.append(ints[key][p, i])
        block(section, rows)
    for key in ("dangle5", "dangle3"):
        block(key, [ints[key][p] for p in range(1, 8)], "/*  @     A     C     G     U   */")
    rows = []
    for p in range(1, 8):
        for q in range(1, 8):
            rows.append(f"/* {pnames[p]:>2}..{pnames[q]:>2} */")
            rows.extend(ints["int11"][p, q, i] for i in range(5))
    block("int11", rows)
    rows = []
    for p in range(1, 8):
        for q in range(1, 8):
            for i in range(5):
                rows.append(f"/* {pnames[p]:>2}.{bnames[i]}..{pnames[q]:>2} */")
                rows.extend(ints["int21"][p, q, i, j] for j in range(5))
    block("int21", rows)
    rows = []
    for p in range(1, 7):
        for q in range(1, 7):
            for i in range(1, 5):
                for j in range(1, 5):
                    rows.append(f"/* {pnames[p]:>2}.{bnames[i]}{bnames[j]}..{pnames[q]:>2} */")
                    rows.extend(ints["int22"][p, q, i, j, k, 1:] for k in range(1, 5))
    block("int22", rows)
    for section, key in (("hairpin", "hairpin"), ("bulge", "bulge"), ("internal", "interior")):
        values = ints[key]
        block(section, [values[s : s + 10] for s in range(0, MAX_LOOP + 1, 10)])
    out += [
        "",
        "# ML_params",
        "/* F = cu*n_unpaired + cc + ci*loop_degree (+TermAU) */",
        "/*\t    cu\t cu_dH\t    cc\t cc_dH\t    ci\t ci_dH  */",
        "\t"
        + "\t".join(
            _format_value(ints[k]) for k in ("ml_base", "ml_base", "ml_closing", "ml_closing", "ml_intern", "ml_intern")
        ),
        "",
        "# NINIO",
        "/* Ninio = MIN(max, m*|n1-n2| */",
        "/*\t    m\t  m_dH     max  */",
        "\t" + "\t".join(_format_value(ints[k]) for k in ("ninio", "ninio", "max_ninio")),
        "",
        "# Misc",
        "/* all parameters are pairs of 'energy enthalpy' */",
        "/*    DuplexInit     TerminalAU      LXC */",
        f"   {410:6d} {360:6d} {_format_value(ints['terminal_au'])} {_format_value(ints['terminal_au'])} "
        f"{raw['lxc']:3.6f} {0:6d}",
    ]
    for section, length in (("Hexaloops", 8), ("Tetraloops", 6), ("Triloops", 5)):
        out += ["", f"# {section}"]
        for seq, e in special.items():
            if len(seq) == length:
                value = int(np.rint(e))
                out.append(f"\t{seq} {value:6d} {value:6d}")
    out += ["", "# END", ""]
    return "\n".join(out)


def save_parameter_file(params, path, *, comment: str | None = None) -> None:
    """Writes ``params`` as a ViennaRNA 2.0 ``.par`` file (``RNA.params_load(path)`` reads it).

    Energies are rounded to integer dcal/mol (the format's unit; ``+inf`` is written ``INF``).
    Two things the format cannot carry give a warning: positive entries of
    :data:`CLIPPED_TABLES` (ViennaRNA clips them to 0) and int22 entries with N that are not the
    maximum over ACGU (the format has no N rows for int22; readers derive them).
    Entries the foldax layout does not hold are written as ViennaRNA derives its non-standard
    entries: the non-standard pair type (7) gets the maximum over the six canonical types. The
    enthalpy sections repeat the energies (a temperature-independent model: at 37 C, the only
    temperature this model covers, ViennaRNA ignores enthalpies), DuplexInit (unused for single
    sequences) is Turner 2004's, and ``lxc`` goes into ``Misc`` as ViennaRNA writes it (its
    reader ignores it and uses 107.856; :func:`load_parameter_file` reads it back). Special
    hairpins: at most 40 of each length (ViennaRNA's limit).

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "turner.par"
    >>> save_parameter_file(turner2004(), path)
    >>> again = load_parameter_file(path)
    >>> round(float(again["stack"][0, 0]), 4), round(float(again["special_hairpins"]["CUUCGG"]), 4)
    (-2.4, 3.7)
    """
    text = parameters_to_string(params, comment=comment)
    with open(os.fspath(path), "w", encoding="utf-8") as handle:
        handle.write(text)
