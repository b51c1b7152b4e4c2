"""``--params``: the parameter sets shipped with foldax, by name, and parameter files.

A name is looked up in the registry ``layers/data/registry.json`` (:func:`shipped`):

* ``turner2004`` -- the Turner 2004 free energies as ViennaRNA 2.x uses them (RNAfold's);
* ``stacking`` -- the stacking model trained on all of ArchiveII (its file ships later);
* ``handset`` -- :func:`layers.default_params`, hand-set stacking scores (no training).

:data:`DEFAULT` is what ``foldax fold`` uses without ``--params``. A path may be a ViennaRNA
``.par`` file (:func:`layers.load_parameter_file`), a ``.json`` Turner table file in the
lossless format of ``layers/data/rna_turner2004.json``, or an ``.npz`` of stacking scores
(``foldax export-params``). :func:`load` returns the parameters with a :class:`Provenance`
(what they are and where they came from), which ``foldax fold`` prints on stderr.

Loading goes through ``layers.load_params(name_or_path)`` when the library has it
(``layers/params_io.py``); until then this module reads the same names and files itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from functools import lru_cache

__all__ = ["DEFAULT", "Provenance", "shipped", "load", "STACKING_KEYS"]

#: The parameters ``foldax fold`` folds with when no ``--params`` is given: a name in the registry.
#: (To become the Turner model fine-tuned on ArchiveII once its file ships.)
DEFAULT = "turner2004"

STACKING_KEYS = ("stack", "pair", "unpaired", "loop")
REGISTRY = "registry.json"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where parameters came from: ``name`` (registry name, or None for a file), ``source`` (the
    file, or the builtin function), ``grammar`` (``"turner"`` or ``"stacking"``), ``summary``
    (one line) and ``details`` (the file's own provenance record, if it has one)."""

    name: str | None
    source: str
    grammar: str
    summary: str
    details: str = ""

    def line(self) -> str:
        """One line for stderr: ``turner2004: Turner 2004 ... (layers/data/...; source: ...)``."""
        head = f"{self.name}: {self.summary}" if self.name else self.summary
        return f"{head} ({self.source}" + (f"; {self.details})" if self.details else ")")


@lru_cache(maxsize=1)
def shipped() -> dict:
    """The registry: ``{name: entry}`` (see ``layers/data/registry.json``)."""
    from importlib import resources

    text = resources.files("foldax.layers").joinpath("data", REGISTRY).read_text(encoding="utf-8")
    return json.loads(text)["params"]


def _data_path(file: str) -> str:
    from importlib import resources

    return str(resources.files("foldax.layers").joinpath("data", file))


def load(spec: str, *, dtype=None):
    """``(params, Provenance)`` of a registry name or a parameter file (see the module docstring).

    ``dtype``: of the energy tables read from files; default JAX's default float (float32,
    or float64 with ``jax_enable_x64``), which also spares a conversion program per table.

    Raises FileNotFoundError (no such name or file; the message lists the names) or
    ValueError (an unreadable or malformed file, naming it).
    """
    registry = shipped()
    if spec in registry:
        return _load_shipped(spec, registry[spec], dtype)
    if not os.path.exists(spec):
        raise FileNotFoundError(f"--params {spec}: neither a shipped parameter set ({', '.join(registry)}) nor an "
                                f"existing file")
    if os.path.isdir(spec):
        raise ValueError(f"--params {spec}: a directory that is not a training workdir")
    ext = os.path.splitext(spec)[1].lower()
    if ext not in (".par", ".json", ".npz"):
        raise ValueError(f"--params {spec}: unknown kind of parameter file (expected .par, .json, .npz or a "
                         f"training workdir)")
    params, details = _via_library(spec, dtype) or _read_file(spec, ext, dtype)
    grammar = _grammar(params)
    summary = {"turner": "Turner-model free energies", "stacking": "stacking-model scores"}[grammar]
    return params, Provenance(None, spec, grammar, f"{summary} from a file", details)


def _load_shipped(name: str, entry: dict, dtype):
    from foldax import layers

    if "builtin" in entry:
        params = getattr(layers, entry["builtin"])()
        return params, Provenance(name, f"layers.{entry['builtin']}()", entry["grammar"], entry["summary"])
    path = _data_path(entry["file"])
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--params {name}: its file {entry['file']} is not in this installation of foldax "
                                f"(layers/data/); choose another: {', '.join(n for n in shipped() if n != name)}")
    ext = os.path.splitext(path)[1].lower()
    params, details = _via_library(name, dtype) or _read_file(path, ext, dtype)
    return params, Provenance(name, f"layers/data/{entry['file']}", entry["grammar"], entry["summary"], details)


def _via_library(spec: str, dtype):
    """``layers.load_params`` when the library has it (it reads the same names and files)."""
    from foldax import layers

    loader = getattr(layers, "load_params", None)
    if loader is None:
        return None
    params = loader(spec)
    return params, ""


def _read_file(path: str, ext: str, dtype):
    """``(params, provenance text)`` of a parameter file (the fallback reader)."""
    from foldax import layers

    if ext == ".par":
        try:
            params = layers.load_parameter_file(path, dtype=dtype)
        except OSError as err:
            raise ValueError(f"--params {path}: cannot read ({err.strerror})") from None
        except ValueError as err:
            raise ValueError(f"--params {path}: {err}") from None
        return params, _par_comment(path)
    if ext == ".json":
        return _read_turner_json(path, dtype)
    return _read_npz(path)


def _par_comment(path: str) -> str:
    """The first ``/* ... */`` comment of a .par file (where ViennaRNA's files name their source)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(20), fh):
                line = line.strip()
                if line.startswith("/*"):
                    return line.strip("/* ").strip()
    except OSError:
        pass
    return ""


def _read_turner_json(path: str, dtype):
    from foldax.layers import energy_params

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        raw = energy_params._raw_from_data(data, os.path.basename(path))
        params = energy_params._from_raw(raw, dtype)
    except OSError as err:
        raise ValueError(f"--params {path}: cannot read ({err.strerror})") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--params {path}: not a Turner parameter file in foldax's JSON format ({err})") from None
    return params, _describe(data.get("provenance"))


def _describe(record) -> str:
    """A short text of a file's provenance record (dict or string)."""
    if isinstance(record, dict):
        keep = [f"{k}: {v}" for k, v in record.items() if k != "citations" and isinstance(v, (str, int, float))]
        return "; ".join(keep)
    return str(record) if record else ""


def _read_npz(path: str):
    import numpy as np

    from foldax import layers

    try:
        with np.load(path) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files}
    except Exception as err:  # noqa: BLE001 - any unreadable file is a user error here
        raise ValueError(f"--params {path}: not a readable .npz file ({err})") from None
    details = _describe(json.loads(str(arrays.pop("provenance")))) if "provenance" in arrays else ""
    missing = [k for k in STACKING_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"--params {path}: missing arrays {missing} (found {sorted(arrays)}; expected "
                         f"{list(STACKING_KEYS)})")
    try:
        return layers.check_params({k: arrays[k] for k in STACKING_KEYS}), details
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"--params {path}: {err}") from None


def _grammar(params) -> str:
    from foldax import layers

    return "turner" if layers.is_energy_params(params) else "stacking"
