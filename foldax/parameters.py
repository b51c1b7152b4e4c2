"""``--params``: the parameter sets shipped with foldax, by name, and parameter files.

A name is looked up in the registry ``layers/data/registry.json`` (:func:`shipped`):

* ``turner2004`` -- the Turner 2004 free energies as ViennaRNA 2.x uses them (RNAfold's);
* ``stacking`` -- the stacking model trained on ArchiveII (``configs/default.py``, random split);
* ``handset`` (or ``default``) -- :func:`foldax.layers.default_params`, hand-set stacking scores
  (no training);
* ``turner1999`` -- the Turner 1999 free energies (Mathews et al. 1999), the set Turner 2004 revised;
* ``andronescu2007``, ``langdon2018`` -- ViennaRNA's other RNA parameter sets (``.par`` files), fit to
  known structures from the databases ArchiveII also draws on: ArchiveII scores flatter them.

``foldax fold --params A+B`` mixes sets (:func:`foldax.fold.load_model`); each is loaded here. The
registry also names mixtures (:func:`mixtures`):

* ``turner2004+turner1999+stacking`` -- the MEA structure (gamma 1) of ``0.35 P_turner2004 +
  0.35 P_turner1999 + 0.3 P_stacking``, the weight and gamma chosen by a nested family-fold on
  ArchiveII (BENCHMARKS.md, "A trained stacking model mixed in"): :data:`DEFAULT`;
* ``turner2004+turner1999`` -- the MEA structure (gamma 0.5) of the mean of Turner 2004's and Turner
  1999's pair probabilities, chosen by family-fold on ArchiveII (BENCHMARKS.md): energy parameters
  only, so ``--noLP`` without ``--params`` folds with it (:data:`DEFAULT_ENERGY`).

:data:`DEFAULT` is what ``foldax fold`` uses without ``--params``. A path may be a ViennaRNA
``.par`` file (:func:`foldax.layers.load_parameter_file`), a ``.json`` Turner table file in the
lossless format of ``layers/data/rna_turner2004.json``, or an ``.npz`` of stacking scores
(``foldax export-params``). :func:`load` returns the parameters with a :class:`Provenance`
(what they are and where they came from), which ``foldax fold`` prints on stderr.

Loading is :func:`foldax.layers.load_params` (the same names and files from Python); this module adds
the one-line provenance ``foldax fold`` prints, and reads the registry without importing JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
from functools import lru_cache

__all__ = ["DEFAULT", "DEFAULT_ENERGY", "Provenance", "shipped", "mixtures", "is_mixture", "load"]

#: The parameters ``foldax fold`` folds with when no ``--params`` is given: a mixture of the registry,
#: the most accurate model on ArchiveII family-fold, full length (mean F1 0.573 over 10 held-out
#: families, against 0.567 for :data:`DEFAULT_ENERGY` and RNAfold's 0.533; CLL fine-tuning of the
#: Turner tables selected Turner 2004 itself, so no fine-tuned file ships; BENCHMARKS.md).
#: ``--params turner2004`` is RNAfold.
DEFAULT = "turner2004+turner1999+stacking"

#: What ``foldax fold`` folds with when an option needs energy parameters (``--noLP``) and no
#: ``--params`` is given: :data:`DEFAULT` without its stacking member, which has no such option.
DEFAULT_ENERGY = "turner2004+turner1999"

REGISTRY = "registry.json"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where parameters came from: ``name`` (registry name, or None for a file), ``source`` (the
    file, or the builtin function), ``grammar`` (``"turner"`` or ``"stacking"``), ``summary``
    (one line), ``details`` (the file's own provenance record, if it has one) and ``mea_gamma``
    (the MEA ``gamma`` of ``foldax fold --mea`` without ``--gamma``: the registry entry's, else 1)."""

    name: str | None
    source: str
    grammar: str
    summary: str
    details: str = ""
    mea_gamma: float = 1.0

    def line(self) -> str:
        """One line for stderr: ``turner2004: Turner 2004 ... (layers/data/...; source: ...)``."""
        head = f"{self.name}: {self.summary}" if self.name else self.summary
        return f"{head} ({self.source}" + (f"; {self.details})" if self.details else ")")


def _data_path(file: str) -> str:
    """A file of ``layers/data/`` (installed: ``foldax/layers/data/``), found without importing
    :mod:`foldax.layers` (and so JAX)."""
    import importlib.util

    return os.path.join(importlib.util.find_spec("foldax.layers").submodule_search_locations[0], "data", file)


@lru_cache(maxsize=1)
def shipped() -> dict:
    """The registry: ``{name: entry}`` (``layers/data/registry.json``; the same as
    :func:`foldax.layers.params_io.shipped_params`)."""
    with open(_data_path(REGISTRY), encoding="utf-8") as fh:
        return json.load(fh)["params"]


@lru_cache(maxsize=1)
def mixtures() -> dict:
    """The registry's named mixtures: ``{name: entry}`` (``members``, ``weights``, ``summary``,
    ``mea_gamma``, ``familyfold``; :func:`foldax.layers.params_io.shipped_mixtures`)."""
    with open(_data_path(REGISTRY), encoding="utf-8") as fh:
        return json.load(fh).get("mixtures", {})


def is_mixture(spec: str | None) -> bool:
    """Whether ``--params spec`` (None: :data:`DEFAULT`) names a mixture: a registry mixture, or
    ``A+B[+...]`` that is not an existing path. A mixture folds by MEA only.

    >>> is_mixture(None), is_mixture("turner2004"), is_mixture("turner2004+andronescu2007")
    (True, False, True)
    """
    spec = DEFAULT if spec is None else spec
    return spec in mixtures() or ("+" in spec and not os.path.exists(spec))


def load(spec: str, *, dtype=None, temperature: float = 37.0):
    """``(params, Provenance)`` of a registry name or a parameter file (see the module docstring);
    the parameters are :func:`foldax.layers.load_params`'s (``temperature``: its, energy sets only).

    ``dtype``: of the tables; default JAX's default float (float32, or float64 with
    ``jax_enable_x64``), which also spares a conversion program per table.

    Raises FileNotFoundError (no such name or file; the message lists the names) or
    ValueError (an unreadable or malformed file, naming it).
    """
    from foldax import layers
    from foldax.layers.params_io import ALIASES, shipped_file

    registry = shipped()
    spec = ALIASES.get(spec, spec)
    if spec in mixtures():
        raise ValueError(f"--params {spec}: a mixture of {', '.join(mixtures()[spec]['members'])}, not one parameter "
                         f"set (foldax.fold.load_model folds it)")
    if spec not in registry:
        if not os.path.exists(spec):
            raise FileNotFoundError(f"--params {spec}: neither a shipped parameter set "
                                    f"({', '.join([*registry, *mixtures()])}) nor "
                                    f"an existing file")
        if os.path.isdir(spec):
            raise ValueError(f"--params {spec}: a directory that is not a training workdir")
        if os.path.splitext(spec)[1].lower() not in (".par", ".json", ".npz"):
            raise ValueError(f"--params {spec}: unknown kind of parameter file (expected .par, .json, .npz or a "
                             f"training workdir)")
    if dtype is None:
        import jax.numpy as jnp

        dtype = jnp.zeros(()).dtype
    try:
        params = layers.load_params(spec, dtype=dtype, temperature=temperature)
        path = shipped_file(spec) if spec in registry else spec
        details = _par_comment(path) if path and path.endswith(".par") else _describe(layers.read_provenance(spec))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--params {err}") from None
    except (OSError, ValueError) as err:  # their messages start with the file's name
        raise ValueError(f"--params {err}") from None
    except (KeyError, TypeError) as err:
        raise ValueError(f"--params {spec}: {err}") from None
    grammar = "turner" if layers.is_energy_params(params) else "stacking"
    if spec in registry:
        entry = registry[spec]
        source = f"foldax.layers.{entry['builtin']}()" if "builtin" in entry else f"layers/data/{entry['file']}"
        return params, Provenance(spec, source, grammar, entry["summary"], details,
                                  float(entry.get("mea_gamma", {}).get("value", 1.0)))
    summary = {"turner": "Turner-model free energies", "stacking": "stacking-model scores"}[grammar]
    return params, Provenance(None, spec, grammar, f"{summary} from a file", details)


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


def _describe(record) -> str:
    """A short text of a file's provenance record (dict or string)."""
    if isinstance(record, dict):
        keep = [f"{k}: {v}" for k, v in record.items() if k != "citations" and isinstance(v, (str, int, float))]
        return "; ".join(keep)
    return str(record) if record else ""
