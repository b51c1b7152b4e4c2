"""Training configs (``ml_collections``): each module has ``get_config()``.

* :mod:`foldax.configs.default` -- the stacking model on ArchiveII, tRNA held out (the main run).
* :mod:`foldax.configs.tiny` -- a smoke test: a few dozen steps on a small subset, under a minute.
* :mod:`foldax.configs.synthetic` -- data sampled from known teacher parameters (recovery check).
* :mod:`foldax.configs.neural` -- :class:`foldax.model.NeuralPhiModel` (a neural encoder writing phi).
* :mod:`foldax.configs.turner` -- :class:`foldax.model.TurnerModel`: the Turner 2004 energies fine-tuned by CLL
  with a prior toward Turner 2004 (``configs/turner.py:neural``: the ``turner_neural`` model, which adds the
  phi encoder).

Use: ``python -m foldax.train.main train --config configs/default.py --workdir runs/x
[--config.field=value ...]``; ``--config.data.train_files=a.dbn,b/*.ct`` (and
``valid_files``, ``eval_files``) switch to your own data.
"""
