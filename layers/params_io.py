"""Parameter files of either grammar: :func:`load_params` and :func:`save_params`.

``load_params(name_or_path)`` returns the parameter pytree that every function of
:mod:`foldax.layers` takes (the grammar follows from the keys, see :func:`foldax.layers.is_energy_params`):

==================  ==========================================================================
a shipped name      :func:`shipped_params` (``layers/data/registry.json``): ``"turner2004"``
                    (ViennaRNA 2.x's default energies, RNAfold's), ``"stacking"`` (the stacking
                    model trained on ArchiveII), ``"handset"`` or ``"default"``
                    (:func:`foldax.layers.default_params`), ...
``*.json``          a file :func:`save_params` wrote (either grammar, lossless, with provenance),
                    or the packaged energy format ``foldax-energy-params-1`` (integer dcal/mol)
``*.npz``           stacking scores (``stack pair unpaired loop``, as ``foldax export-params``
                    writes them) or Turner tables written by :func:`save_params`
``*.par``           a ViennaRNA 2.0 parameter file (:func:`foldax.layers.load_parameter_file`)
==================  ==========================================================================

``foldax fold --params NAME|FILE`` reads the same names and files. A registry *mixture*
(:func:`shipped_mixtures`, e.g. ``"turner2004+turner1999+stacking"``, what ``foldax fold`` folds with
by default) is several sets whose pair probabilities are averaged: :func:`load_mixture` loads it.

The JSON format (``"format": "foldax-params-1"``) holds every table as nested lists of
numbers in its own units (kcal/mol for Turner tables, natural-log scores for stacking),
``null`` for ``+inf`` (the loops Turner tables forbid), the special hairpins as
``{sequence: energy}``, the dtype the values were saved from and a free-form ``provenance``
object. Numbers are written as the shortest decimal that reads back to the same float64, and
float32 values are exactly representable in float64, so loading with the saved dtype gives
the saved arrays bit for bit. ``.npz`` files are lossless too (Turner special hairpins as
arrays ``special_hairpins/<SEQUENCE>``, provenance as the JSON string ``__provenance__``);
``.par`` files round energies to 0.01 kcal/mol (the format's unit) and carry the provenance as a
comment.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> params = load_params("turner2004")
>>> save_params(params, path, provenance={"what": "Turner 2004, unchanged"})
>>> again = load_params(path)
>>> bool(again["hairpin"][0] == params["hairpin"][0]), float(again["special_hairpins"]["CUUCGG"])
(True, 3.700000047683716)
>>> read_provenance(path)["what"]
'Turner 2004, unchanged'
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from importlib import resources
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

__all__ = ["load_params", "load_mixture", "Mixture", "save_params", "read_provenance", "shipped_params",
           "shipped_mixtures", "shipped_file", "FORMAT"]

#: The ``format`` tag of the JSON files :func:`save_params` writes.
FORMAT = "foldax-params-1"
_PROVENANCE_KEY = "__provenance__"
_PROVENANCE_KEYS = (_PROVENANCE_KEY, "provenance")  # the second: files of earlier foldax versions
_SPECIAL_PREFIX = "special_hairpins/"
_STACKING_KEYS = ("stack", "pair", "unpaired", "loop")


REGISTRY = "registry.json"
#: Other names of registry entries (``config.model.init = "default"`` predates the registry).
ALIASES = {"default": "handset"}


@functools.lru_cache(maxsize=1)
def shipped_params() -> dict[str, dict]:
    """The parameter sets shipped with foldax, ``{name: entry}`` from ``layers/data/registry.json``:
    ``file`` (in ``layers/data/``) or ``builtin`` (a function of :mod:`foldax.layers`), ``grammar``
    and a one-line ``summary``. A file-backed entry may be missing from an installation (its file
    not built yet); :func:`load_params` then says so."""
    text = resources.files("foldax.layers").joinpath("data", REGISTRY).read_text(encoding="utf-8")
    return json.loads(text)["params"]


@functools.lru_cache(maxsize=1)
def shipped_mixtures() -> dict[str, dict]:
    """The named mixtures of the registry, ``{name: entry}``: ``members`` (names of
    :func:`shipped_params`), ``weights``, a one-line ``summary``, ``mea_gamma`` (the MEA gamma and how
    it was chosen) and ``familyfold`` (the recipe's family-fold numbers on ArchiveII)."""
    text = resources.files("foldax.layers").joinpath("data", REGISTRY).read_text(encoding="utf-8")
    return json.loads(text).get("mixtures", {})


class Mixture(NamedTuple):
    """A mixture of parameter sets (:func:`load_mixture`): its structures are decoded by
    :func:`foldax.layers.mea_structure` at ``mea_gamma`` from
    ``layers.mixture_pair_probs(members, tokens, weights=weights)``."""

    members: tuple
    weights: tuple
    mea_gamma: float


def load_mixture(name: str, *, dtype=jnp.float32) -> Mixture:
    """A named mixture of the registry (:func:`shipped_mixtures`): its members loaded by
    :func:`load_params`, their weights and its MEA gamma.

    Example (``foldax fold``'s default model, from Python):

    >>> from foldax import layers
    >>> mix = layers.load_mixture("turner2004+turner1999")
    >>> x = layers.encode("GGGAAAUCCCGCGCAUAUGCGCAAAGGG")
    >>> probs = layers.mixture_pair_probs(mix.members, x, weights=mix.weights)
    >>> layers.to_dot_bracket(layers.mea_structure(probs, gamma=mix.mea_gamma))
    '(((....)))((((....))))......'
    """
    mixtures = shipped_mixtures()
    if name not in mixtures:
        raise FileNotFoundError(f"{name}: not a shipped mixture ({', '.join(mixtures) or 'none'})")
    entry = mixtures[name]
    return Mixture(tuple(load_params(member, dtype=dtype) for member in entry["members"]),
                   tuple(float(w) for w in entry["weights"]), float(entry["mea_gamma"]["value"]))


def shipped_file(name: str) -> str | None:
    """The path of a shipped parameter set's file (None for a builtin one)."""
    entry = shipped_params()[ALIASES.get(name, name)]
    return str(resources.files("foldax.layers").joinpath("data", entry["file"])) if "file" in entry else None


def _named(name: str) -> bool:
    return ALIASES.get(name, name) in shipped_params()


def _is_energy(params) -> bool:
    from foldax.layers.inside import is_energy_params

    return is_energy_params(params)


def load_params(name_or_path, *, dtype=jnp.float32, temperature: float = 37.0) -> dict:
    """The parameters named ``name_or_path`` (:func:`shipped_params`) or stored in that file.

    Args:
      name_or_path: a shipped parameter set (:func:`shipped_params`: ``"turner2004"``,
        ``"stacking"``, ``"handset"`` (alias ``"default"``), ...) or a ``.json`` / ``.npz`` /
        ``.par`` file (module docstring).
      dtype: of the returned arrays (float32 default; float64 needs ``jax_enable_x64``).
      temperature: degrees Celsius (``RNAfold -T``); Turner energy parameters only. Away from 37 C the
        energies are rescaled as ViennaRNA does (:func:`foldax.layers.turner2004`): a ``.par`` file or
        the packaged Turner 2004 file with its own enthalpies, any other set (``.npz``, ``.json``
        tables trained at 37 C) with Turner 2004's.

    Returns:
      a dict of arrays: the stacking scores ``stack pair unpaired loop`` or the Turner energy
      tables (with the dict ``special_hairpins``), checked by :func:`foldax.layers.check_params`.

    Raises:
      FileNotFoundError for a missing file (or an unknown name), ValueError naming the file
      and what is wrong for an unreadable one.
    """
    name = os.fspath(name_or_path)
    if name in shipped_mixtures() and not os.path.exists(name):
        members = shipped_mixtures()[name]["members"]
        raise ValueError(f"{name} is a mixture of {', '.join(members)} (its structures are the MEA structures of "
                         f"their mean pair probabilities), not one parameter set: load it with "
                         f"layers.load_mixture({name!r}), or one member with layers.load_params({members[0]!r})")
    if _named(name):
        entry = shipped_params()[ALIASES.get(name, name)]
        if "builtin" in entry:
            import foldax.layers

            if float(temperature) != 37.0:
                _require_turner({}, name, temperature)
            return getattr(foldax.layers, entry["builtin"])(dtype)
        path = shipped_file(name)
        if not os.path.isfile(path):
            others = ", ".join(n for n in shipped_params() if n != name)
            raise FileNotFoundError(f"{name}: its file {entry['file']} is not in this installation of foldax "
                                    f"(foldax/layers/data/); choose another: {others}")
        name = path
    elif os.path.isdir(name):
        raise ValueError(f"{name} is a directory; load_params reads a parameter file (.json, .npz, .par) or a name "
                         f"({', '.join(shipped_params())}). For a training workdir, write one with "
                         f"'foldax export-params --workdir {name} --out FILE'")
    elif not os.path.exists(name):
        raise FileNotFoundError(f"{name}: no such parameter file, and not a shipped parameter set "
                                f"({', '.join(shipped_params())})")
    ext = os.path.splitext(name)[1].lower()
    if ext == ".json":
        params = _load_json(name, dtype, temperature)
    elif ext == ".npz":
        params = _load_npz(name, dtype)
    elif ext == ".par":
        from foldax.layers.energy_params import load_parameter_file

        return load_parameter_file(name, dtype=dtype, temperature=temperature)
    else:
        raise ValueError(f"{name}: unknown parameter file type {ext!r}; expected .json, .npz or .par")
    params = _checked(params, name)
    from foldax.layers.energy_params import at_temperature, kt

    if float(temperature) == 37.0 or ("kT" in params and abs(float(params["kT"]) - kt(temperature)) < 1e-6):
        return params  # (the packaged format's reader has moved it already)

    _require_turner(params, name, temperature)
    try:
        return at_temperature(params, temperature)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _require_turner(params, name, temperature):
    from foldax.layers.inside import is_energy_params

    if not is_energy_params(params):
        raise ValueError(f"{name}: stacking-grammar scores have no temperature; temperature={temperature:g} needs "
                         f"Turner energy parameters (e.g. turner2004)")


def _checked(params, name):
    from foldax.layers.inside import check_params

    try:
        return check_params(params)
    except (KeyError, TypeError, ValueError) as err:
        message = err.args[0] if err.args else str(err)
        raise ValueError(f"{name}: {message}") from None


# --------------------------------------------------------------------------- JSON


def _nested(values: np.ndarray, name: str, key: str):
    """An array as nested lists of floats, +inf as None (NaN and -inf are refused)."""
    values = np.asarray(values)
    if np.isnan(values).any() or (values == -np.inf).any():
        raise ValueError(f"cannot save {name}: parameter {key!r} holds NaN or -inf")
    as_list = values.astype(np.float64).tolist()
    return _inf_to_none(as_list)


def _inf_to_none(nested):
    if isinstance(nested, list):
        return [_inf_to_none(v) for v in nested]
    return None if nested == math.inf else nested


def _none_to_inf(nested):
    if isinstance(nested, list):
        return [_none_to_inf(v) for v in nested]
    return math.inf if nested is None else nested


def _json_text(params, provenance, name) -> str:
    params = {k: v for k, v in params.items()}
    energy = _is_energy(params)
    tables = {k: _nested(v, name, k) for k, v in params.items() if k != "special_hairpins"}
    dtypes = {str(np.asarray(v).dtype) for k, v in params.items() if k != "special_hairpins"}
    data = {
        "format": FORMAT,
        "grammar": "turner" if energy else "stacking",
        "units": "kcal/mol at 37 C (free energies)" if energy else "natural-log scores (higher is more likely)",
        "dtype": dtypes.pop() if len(dtypes) == 1 else "mixed",
        "tables": tables,
    }
    if energy:
        special = {}
        for seq, value in params["special_hairpins"].items():
            value = float(np.asarray(value))
            if not math.isfinite(value):
                raise ValueError(f"cannot save {name}: special hairpin {seq!r} has energy {value}")
            special[seq] = value
        data["special_hairpins"] = special
    data["provenance"] = dict(provenance or {})
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def _load_json(path: str, dtype, temperature: float = 37.0) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON parameter file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a foldax parameter file (a JSON object with 'format' expected)")
    fmt = data.get("format")
    if fmt == "foldax-energy-params-1":  # the packaged Turner data file's own format (integer dcal/mol)
        from foldax.layers import energy_params

        try:
            return energy_params._from_data_file(data, os.path.basename(path), dtype, temperature)
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from None
    if fmt != FORMAT:
        raise ValueError(f"{path}: unknown format {fmt!r} (expected {FORMAT!r}, written by layers.save_params)")
    tables = data.get("tables")
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: no 'tables' object")
    params = {}
    for key, nested in tables.items():
        try:
            params[key] = jnp.asarray(np.array(_none_to_inf(nested), dtype=np.float64), dtype=dtype)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: table {key!r} is not a rectangular array of numbers ({err})") from None
    if data.get("grammar") == "turner" or "special_hairpins" in data:
        special = data.get("special_hairpins")
        if not isinstance(special, dict):
            raise ValueError(f"{path}: a Turner parameter file needs the object 'special_hairpins'")
        try:
            params["special_hairpins"] = {str(s): jnp.asarray(float(e), dtype=dtype) for s, e in special.items()}
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: special_hairpins: {err}") from None
    return params


# --------------------------------------------------------------------------- npz


def _load_npz(path: str, dtype) -> dict:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable .npz file ({err})") from None
    for key in _PROVENANCE_KEYS:
        arrays.pop(key, None)
    special = {k[len(_SPECIAL_PREFIX):]: v for k, v in arrays.items() if k.startswith(_SPECIAL_PREFIX)}
    params = {k: jnp.asarray(v, dtype=dtype) for k, v in arrays.items() if not k.startswith(_SPECIAL_PREFIX)}
    if special or "mismatch_hairpin" in params:
        params["special_hairpins"] = {s: jnp.asarray(v, dtype=dtype) for s, v in special.items()}
    elif set(params) != set(_STACKING_KEYS):
        missing = sorted(set(_STACKING_KEYS) - set(params))
        extra = sorted(set(params) - set(_STACKING_KEYS))
        raise ValueError(f"{path}: not a parameter file: " + (f"missing arrays {missing}" if missing else "")
                         + ("; " if missing and extra else "") + (f"unexpected arrays {extra}" if extra else "")
                         + f" (stacking scores have {list(_STACKING_KEYS)})")
    return params


def _save_npz(params, path: str, provenance) -> None:
    arrays = {k: np.asarray(v) for k, v in params.items() if k != "special_hairpins"}
    if _is_energy(params):
        for seq, value in params["special_hairpins"].items():
            arrays[_SPECIAL_PREFIX + seq] = np.asarray(value)
    if provenance:
        arrays[_PROVENANCE_KEY] = np.asarray(json.dumps(dict(provenance), sort_keys=True))
    with open(path, "wb") as handle:  # np.savez would append .npz to a name without it
        np.savez(handle, **arrays)


# --------------------------------------------------------------------------- public


def save_params(params, path, *, provenance: Mapping | None = None) -> None:
    """Writes ``params`` (either grammar) to ``path``; the extension picks the format.

    * ``.json`` -- lossless, with ``provenance`` (any JSON-serialisable mapping: data, config,
      commit, metrics, ...);
    * ``.npz`` -- lossless; provenance as the JSON string array ``__provenance__``;
    * ``.par`` -- Turner tables only: a ViennaRNA 2.0 parameter file
      (:func:`foldax.layers.save_parameter_file`; energies rounded to 0.01 kcal/mol), provenance in a
      comment. ``RNA.params_load`` and :func:`load_params` read it.

    Parameters holding NaN (or ``-inf``) are refused with a ``ValueError``.
    """
    from foldax.layers.inside import check_params

    path = os.fspath(path)
    params = check_params(params)
    ext = os.path.splitext(path)[1].lower()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if ext == ".json":
        text = _json_text(params, provenance, path)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    elif ext == ".npz":
        for key, value in params.items():
            if key != "special_hairpins" and np.isnan(np.asarray(value)).any():
                raise ValueError(f"cannot save {path}: parameter {key!r} holds NaN")
        _save_npz(params, path, provenance)
    elif ext == ".par":
        if not _is_energy(params):
            raise ValueError(f"cannot save {path}: a .par file holds Turner energy tables, these are stacking "
                             f"scores (use .json or .npz)")
        from foldax.layers.energy_params import save_parameter_file

        comment = "provenance: " + json.dumps(dict(provenance), sort_keys=True) if provenance else None
        save_parameter_file(params, path, comment=comment)
    else:
        raise ValueError(f"cannot save {path}: unknown parameter file type {ext!r}; use .json, .npz or .par")


def read_provenance(name_or_path) -> dict | None:
    """The provenance stored with a shipped parameter set (by name) or in a ``.json`` / ``.npz``
    parameter file (None if it has none)."""
    path = os.fspath(name_or_path)
    if _named(path):
        path = shipped_file(path)
        if path is None or not os.path.isfile(path):
            return None
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        with open(path, encoding="utf-8") as handle:
            return json.load(handle).get("provenance") or None
    if ext == ".npz":
        with np.load(path, allow_pickle=False) as f:
            for key in _PROVENANCE_KEYS:
                if key in f.files:
                    return json.loads(str(f[key]))
    return None
