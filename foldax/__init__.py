"""foldax: the command line (``foldax fold``, ``foldax plot``, ``foldax train``...) and plots.

* :mod:`foldax.cli` -- the ``foldax`` console entry point (:func:`foldax.cli.main`).
* :mod:`foldax.fold` -- input reading, batched folding with :mod:`layers`, output formats.
* :mod:`foldax.parameters` -- ``--params``: the shipped parameter sets by name, parameter files.
* :mod:`foldax.programs` -- the compiled fold programs, kept across runs (``~/.cache/foldax``).
* :mod:`foldax.plots` -- dot plots, arc diagrams, training curves (matplotlib, Agg).

Importing :mod:`foldax` is cheap: JAX and matplotlib are imported by the submodules.
"""

__all__ = ["cli", "fold", "parameters", "plots", "programs"]
