"""foldax: the RNA inside algorithm as a fast, exact, differentiable JAX core, with training.

One import namespace; the repository's top-level folders are its subpackages:

* :mod:`foldax.layers` -- the DP engine, grammars (stacking, Turner 2004), decoding, NNX/Linen layers.
  Its public functions are also re-exported here: ``foldax.log_partition`` is
  ``foldax.layers.log_partition`` (imported on first use).
* :mod:`foldax.model` -- models, loss, metrics; :mod:`foldax.train` -- the training program,
  input pipeline, evaluation, family-fold; :mod:`foldax.configs` -- shipped configs;
  :mod:`foldax.data` -- file formats, ArchiveII (tensorflow-datasets builder).
* :mod:`foldax.cli` -- the ``foldax`` console entry point (:func:`foldax.cli.main`);
  :mod:`foldax.fold` -- batched folding for ``foldax fold``; :mod:`foldax.parameters` -- ``--params``;
  :mod:`foldax.programs` -- compiled fold programs kept across runs (``~/.cache/foldax``);
  :mod:`foldax.plots` -- dot plots, arc diagrams, training curves; :mod:`foldax.hugepages` -- the
  entry points' huge-page start-up setting for XLA's buffers.

Importing :mod:`foldax` is cheap: JAX, Flax and matplotlib are imported by the submodules.

>>> import foldax
>>> round(float(foldax.log_partition(foldax.default_params(), foldax.encode("GGGAAACCC"))), 4) > 0
True
"""

import os as _os

_SUBPACKAGES = ("layers", "model", "train", "configs", "data")


def _map_checkout_folders():
    """In a checkout that is not installed (e.g. ``PYTHONPATH=.``), the subpackages are the folders next
    to this one (``layers/`` is ``foldax.layers``), as the install's package-dir mapping makes them."""
    import importlib.abc
    import importlib.util
    import sys

    parent = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))

    class CheckoutFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            head, _, sub = name.partition(".")
            if head != __name__ or sub not in _SUBPACKAGES:
                return None
            folder = _os.path.join(parent, sub)
            return importlib.util.spec_from_file_location(name, _os.path.join(folder, "__init__.py"),
                                                          submodule_search_locations=[folder])

    sys.meta_path.append(CheckoutFinder())  # last: an installed mapping, if any, answers first


if not _os.path.isdir(_os.path.join(__path__[0], "layers")) and _os.path.isfile(
        _os.path.join(_os.path.dirname(__path__[0]), "layers", "chart.py")):
    _map_checkout_folders()

__all__ = ["cli", "fold", "parameters", "plots", "programs", *_SUBPACKAGES]


def __getattr__(name):
    # The library's public names (foldax.log_partition, ...), importing foldax.layers on first use.
    import importlib

    if name.startswith("__"):  # probes such as __wrapped__ must not import JAX
        raise AttributeError(f"module 'foldax' has no attribute {name!r}")
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    layers = importlib.import_module(f"{__name__}.layers")
    if name in layers.__all__:
        return getattr(layers, name)
    raise AttributeError(f"module 'foldax' has no attribute {name!r}")


def __dir__():
    from foldax import layers

    return sorted(set(globals()) | set(__all__) | set(layers.__all__))
