"""foldax layers: the RNA inside algorithm as a fast, exact, differentiable JAX core."""

from layers.alphabet import ALPHABET, DEFAULT_BUCKETS, PAD_TOKEN, bucket_length, decode, encode, encode_batch
from layers.inside import check_params, log_partition, max_score
from layers.params import default_params, init_params
from layers.semiring import LOG, MAX, LogSemiring, MaxSemiring

__all__ = [
    "ALPHABET",
    "DEFAULT_BUCKETS",
    "PAD_TOKEN",
    "bucket_length",
    "decode",
    "encode",
    "encode_batch",
    "check_params",
    "log_partition",
    "max_score",
    "default_params",
    "init_params",
    "LOG",
    "MAX",
    "LogSemiring",
    "MaxSemiring",
]
