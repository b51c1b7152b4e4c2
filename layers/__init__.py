"""foldax layers: the RNA inside algorithm as a fast, exact, differentiable JAX core."""

from layers.alphabet import ALPHABET, DEFAULT_BUCKETS, PAD_TOKEN, bucket_length, decode, encode, encode_batch
from layers.decoding import best_structure, mea_structure, pair_probs, sample_structures
from layers.devices import use_all_cores
from layers.dotbracket import from_dot_bracket, to_dot_bracket
from layers.energy_params import KT, load_parameter_file, save_parameter_file, turner2004
from layers.free_energy import ensemble_free_energy, free_energy
from layers.inside import check_params, is_energy_params, log_partition, max_score
from layers.params import default_params, init_params
from layers.params_io import load_params, read_provenance, save_params
from layers.semiring import LOG, MAX, LogSemiring, MaxSemiring, SampleSemiring
from layers.structure import log_prob, structure_score

__all__ = [
    "ALPHABET",
    "DEFAULT_BUCKETS",
    "PAD_TOKEN",
    "bucket_length",
    "decode",
    "encode",
    "encode_batch",
    "check_params",
    "is_energy_params",
    "log_partition",
    "max_score",
    "default_params",
    "init_params",
    "LOG",
    "MAX",
    "LogSemiring",
    "MaxSemiring",
    "SampleSemiring",
    "KT",
    "turner2004",
    "load_parameter_file",
    "save_parameter_file",
    "free_energy",
    "ensemble_free_energy",
    "from_dot_bracket",
    "to_dot_bracket",
    "structure_score",
    "log_prob",
    "pair_probs",
    "best_structure",
    "mea_structure",
    "sample_structures",
    "load_params",
    "save_params",
    "read_provenance",
    "use_all_cores",
]

# Flax layers (layers/nnx_layer.py), imported on first use so that `import layers` stays free of Flax.
_LAZY = {"InsideLayer": "layers.nnx_layer", "LinenInsideLayer": "layers.nnx_layer"}
__all__ += list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'layers' has no attribute {name!r}")
