"""The Turner 2004 energy model fine-tuned by CLL on ArchiveII (tRNA held out).

Model (:class:`model.TurnerModel`): every table of ViennaRNA 2.x's Turner 2004 parameters
(kcal/mol, 37 C; the special hairpin energies included) is a parameter, initialised at
Turner 2004 (``model.init``: ``"turner2004"`` or a ``.par`` / ``.json`` parameter file), with
an L2 prior toward the initial values, ``model.prior_strength * SUM (theta - theta_0)^2``, added
to the per-nucleotide CLL loss: units nats/nt per (kcal/mol)^2, i.e. ``1 / (2 sigma^2 N)`` for
a Gaussian prior of width ``sigma`` kcal/mol and ``N`` training nucleotides (see
:mod:`model.models`). ``model.name = "turner_neural"`` adds the ``phi`` encoder of
``configs/neural.py`` (sizes ``model.features`` etc.).

Data: as ``configs/default.py`` (ArchiveII, family ``data.fold`` held out as the test split,
training and validation rows up to 200 nt), plus the Turner grammar's cleaning of the training
and validation structures (``data.noncanonical_pairs``, ``data.long_loops``; see
:mod:`train.datasets`: ArchiveII has no non-canonical pair, and no loop longer than 30 below
300 nt, so at these lengths nothing changes).

Hyperparameters (learning rate 0.01, prior strength 1e-3, 400 steps of batch 16) were chosen
by validation MEA F1 on the training families' random ``valid`` part only -- the held-out
family was not looked at -- in short runs on the 2-core CPU (80 steps, batch 8, rows up to
128 nt); see BENCHMARKS.md / the Turner fine-tuning report for the numbers. The Turner DP is
about 10x heavier than the stacking grammar's: on a shared 2-core CPU one step of 16
sequences of up to 96 nt takes seconds, and compiling a step takes minutes per length bucket
(the persistent compilation cache, ``compilation_cache_dir``, keeps them across runs).
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.name = "turner"  # or "turner_neural" (+ the phi encoder of configs/neural.py)
    config.model.init = "turner2004"  # or a ViennaRNA .par / exported .json file of energy tables
    config.model.prior_strength = 1e-3  # nats/nt per (kcal/mol)^2 toward model.init (module docstring)

    config.data.noncanonical_pairs = "auto"  # "auto" (= "remove" for Turner models) | "remove" | "drop" | "keep"
    config.data.long_loops = "auto"  # "auto" (= "open" for Turner models) | "open" | "drop" | "keep"
    config.data.max_length = 200
    config.data.buckets = (96, 128, 160, 200)  # fewer buckets: each costs a compilation of the Turner DP
    config.data.eval_buckets = (96, 128, 160, 200, 256, 384, 512)

    config.batch_size = 16
    config.eval_batch_size = 32
    config.num_train_steps = 400

    config.optimizer.learning_rate = 0.01  # kcal/mol per step (Adam)
    config.optimizer.warmup_steps = 20
    config.optimizer.grad_clip = 0.0  # the gradients are small (expected-count differences per nucleotide)

    config.log_every = 10
    config.eval_every = 100
    config.checkpoint_every = 100
    return config
