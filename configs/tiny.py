"""Smoke test: a few dozen steps on a small ArchiveII subset (one bucket), in under a minute on CPU."""

from foldax.configs import default


def get_config():
    config = default.get_config()
    config.data.max_length = 96
    config.data.max_eval_length = 96
    config.data.max_train_examples = 128
    config.data.max_valid_examples = 16
    config.data.max_test_examples = 16
    config.data.buckets = (96,)
    config.data.eval_buckets = (96,)
    config.batch_size = 8
    config.eval_batch_size = 16
    config.num_train_steps = 30
    config.optimizer.warmup_steps = 5
    config.log_every = 10
    config.eval_every = 15
    config.checkpoint_every = 15
    config.decoders = ("mea",)
    return config
