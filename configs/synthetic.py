"""Synthetic data sampled from known teacher parameters (``layers.default_params``).

2,000 random sequences of 40/60/80 nt, each with one structure drawn exactly
from the teacher's Boltzmann distribution (``foldax.layers.decoding.sample_structures``);
300 held-out sequences for the test split. A model that recovers the teacher
reaches the teacher's held-out log-likelihood per nucleotide (``summary.json``
reports both: ``test/ll_per_nt`` and ``teacher/test/ll_per_nt``).
"""

from foldax.configs import default


def get_config():
    config = default.get_config()
    config.data.source = "synthetic"
    config.data.max_length = 80
    config.data.max_eval_length = 80
    config.data.max_valid_examples = 0
    config.data.buckets = (48, 64, 80)
    config.data.eval_buckets = (48, 64, 80)
    config.batch_size = 32
    config.eval_batch_size = 64
    config.num_train_steps = 600
    config.optimizer.learning_rate = 0.1
    config.optimizer.warmup_steps = 20
    config.eval_every = 200
    config.checkpoint_every = 200
    config.best_metric = "ll_per_nt"
    return config
