# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Training the score tensors
#
# A short run of the training loop (`foldax.train.train.train_and_evaluate(config, workdir)`)
# on the smoke-test config `configs/tiny.py`: the stacking model (656 scores, random
# init) trained with the conditional log-likelihood loss
# $-\log p(s \mid x) = \log Z(x) - \mathrm{score}(x, s)$ per nucleotide, on 128
# ArchiveII sequences of at most 96 nt with the tRNA family held out as the test set.
# Then: training curves from the workdir's logs, and a held-out tRNA's dot plot before
# and after training.
#
# The same run from the command line:
#
# ```bash
# python -m foldax.train.main train --config configs/tiny.py --workdir /tmp/foldax-tiny
# ```
#
# Takes about 30-40 s on a 2-core CPU (30 steps; most of it is XLA compilation).
# Without the shared ArchiveII copy (`../shared/data/archiveii` or `$FOLDAX_ARCHIVEII`)
# it falls back to synthetic data sampled from `layers.default_params()`.

# %%
# %matplotlib inline
import pathlib
import sys

_root = next((p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents] if (p / "layers" / "chart.py").exists()), None)
if _root is not None and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))

import json
import os
import tempfile

import jax
import numpy as np
from flax import nnx

from foldax import layers
from foldax.configs import tiny
from foldax.data.archiveii import default_path as archiveii_path
from foldax import plots
from foldax.model.models import create_model
from foldax.train import train as trainer

# %% [markdown]
# ## The config
#
# An `ml_collections.ConfigDict` (see `configs/default.py` for every field). We keep
# `tiny`'s sizes, log every 2 steps, and switch off the progress bar and the
# persistent compilation cache (so the notebook leaves nothing behind).

# %%
config = tiny.get_config()
config.progress_bar = False
config.compilation_cache_dir = ""
config.async_checkpointing = False
config.log_every = 2  # more points on the training curve
if archiveii_path() is None:  # no ArchiveII here: learn a known teacher's structures instead
    config.data.source = "synthetic"
    config.data.synthetic.lengths = (48, 64, 80)
    config.data.synthetic.num_train, config.data.synthetic.num_valid, config.data.synthetic.num_test = 128, 16, 16
    config.best_metric = "ll_per_nt"
print("data:", config.data.source, "| model:", config.model.name, "| steps:", config.num_train_steps,
      "| batch:", config.batch_size, "| buckets:", tuple(config.data.buckets))

# %% [markdown]
# ## Before training
#
# The model the trainer builds: `foldax.model.models.create_model(config.model, nnx.Rngs(params=seed))`
# -- its score tensors are random, `N(0, 0.1^2)`. We keep a copy to compare with later.

# %%
initial = create_model(config.model, nnx.Rngs(params=int(config.seed))).inside.params_dict()
initial = jax.tree.map(np.asarray, initial)

# %% [markdown]
# ## Train
#
# `train_and_evaluate` writes `config.json`, Orbax checkpoints, `metrics.jsonl` (+
# TensorBoard event files when `tensorboardX` is installed) and `summary.json` into
# the workdir, and returns the summary (validation metrics of the best checkpoint and
# test metrics). Rerunning with the same workdir resumes from the last checkpoint.

# %%
workdir = tempfile.mkdtemp(prefix="foldax-tiny-")
summary = trainer.train_and_evaluate(config, workdir)
print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()
                  if k.startswith(("test/", "valid/")) or k in ("steps", "best_step", "train_wall_s")}, indent=1))
print(sorted(os.listdir(workdir)))

# %% [markdown]
# ## Training curves
#
# `foldax.plots.read_scalars(workdir)` reads the logged scalars (event files and
# `metrics.jsonl`, no TensorFlow needed); `training_curves` plots the loss and the F1
# tags.

# %%
scalars = plots.read_scalars(workdir)
print(sorted(scalars))
plots.training_curves(scalars, title=f"configs/tiny.py ({config.data.source})")

# %% [markdown]
# ## After training: a held-out sequence
#
# `export_params` writes the best checkpoint's score tensors to an `.npz` (the format
# `foldax fold --params` reads). We fold yeast tRNA-Phe -- in the held-out tRNA family
# -- with the initial and the trained tensors.

# %%
trained_path = trainer.export_params(workdir, os.path.join(workdir, "params.npz"))
with np.load(trained_path) as f:
    trained = {k: f[k] for k in ("stack", "pair", "unpaired", "loop")}

SEQUENCE = "GCGGAUUUAGCUCAGUUGGGAGAGCGCCAGACUGAAGAUCUGGAGGUCCUGUGUUCGAUCCACAGAAUUCGCACCA"
REFERENCE = "(((((((..((((........)))).(((((.......))))).....(((((.......))))))))))))...."
tokens, reference = layers.encode(SEQUENCE), layers.from_dot_bracket(REFERENCE)


def f1(pred, ref):
    p = {(i, j) for i, j in enumerate(pred) if j > i}
    r = {(i, j) for i, j in enumerate(ref) if j > i}
    return 2 * len(p & r) / max(len(p) + len(r), 1)


GAMMA = 8.0  # MEA pair weight: a briefly trained model is unsure, a larger gamma commits to more pairs
results = {}
for name, params in (("before", initial), ("after", trained)):
    probs = np.asarray(layers.pair_probs(params, tokens))
    mea = np.asarray(layers.mea_structure(probs, gamma=GAMMA))
    ll = float(layers.log_prob(params, tokens, reference)) / len(SEQUENCE)
    results[name] = probs, mea
    print(f"{name:>6}: {layers.to_dot_bracket(mea)}  F1 {f1(mea, reference):.2f}  "
          f"log p(ref)/nt {ll:.3f}  E[#pairs] {probs.sum() / 2:.1f}")
print(f"{'ref':>6}: {REFERENCE}")

# %%
probs, mea = results["before"]
plots.dot_plot(probs, structure=mea, reference=reference, sequence=SEQUENCE,
               title="tRNA-Phe before training (random scores)")

# %%
probs, mea = results["after"]
plots.dot_plot(probs, structure=mea, reference=reference, sequence=SEQUENCE,
               title=f"tRNA-Phe after {summary['steps']} steps of configs/tiny.py")

# %% [markdown]
# 30 steps on 128 short sequences only start to move the scores; `configs/default.py`
# (1,500 steps on all of ArchiveII <= 200 nt, ~15 min on 2 cores) trains them properly.
# Clean up the temporary workdir when done:

# %%
import shutil

shutil.rmtree(workdir, ignore_errors=True)
