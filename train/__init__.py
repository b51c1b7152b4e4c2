"""Training: the input pipeline, datasets, the training loop and its command line.

* :mod:`foldax.train.input_pipeline` -- shuffled, bucketed, sharded, resumable batches (Grain).
* :mod:`foldax.train.datasets` -- train/valid/test examples of a config (ArchiveII, files, synthetic).
* :mod:`foldax.train.train` -- :func:`~foldax.train.train.train_and_evaluate`, evaluation, export.
* :mod:`foldax.train.main` -- ``train`` / ``eval`` / ``export-params`` (``main(argv)``).

Importing :mod:`foldax.train` is cheap; the submodules import JAX and Flax.
"""
