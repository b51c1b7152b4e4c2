"""foldax layers: the RNA inside algorithm as a fast, exact, differentiable JAX core."""

from foldax.layers.alphabet import ALPHABET, DEFAULT_BUCKETS, PAD_TOKEN, bucket_length, decode, encode, encode_batch
from foldax.layers.compiled import ShapeWatch, release_compiled_programs
from foldax.layers.constraints import ENFORCE_BONUS, constraint_phi, enforced_bonus, must_pair_positions
from foldax.layers.decoding import best_structure, mea_structure, mixture_pair_probs, pair_probs, sample_structures
from foldax.layers.devices import use_all_cores
from foldax.layers.dotbracket import from_dot_bracket, to_dot_bracket
from foldax.layers.energy_params import (KT, at_temperature, kt, load_parameter_file, save_parameter_file, turner2004,
                                         without_dangles)
from foldax.layers.free_energy import FORBIDDEN_PHI, ensemble_free_energy, free_energy, isolated_pairs
from foldax.layers.inside import check_params, is_energy_params, log_partition, max_score
from foldax.layers.params import default_params, init_params
from foldax.layers.params_io import Mixture, load_mixture, load_params, read_provenance, save_params
from foldax.layers.semiring import LOG, MAX, LogSemiring, MaxSemiring, SampleSemiring
from foldax.layers.structure import log_prob, structure_score

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
    "kt",
    "at_temperature",
    "without_dangles",
    "turner2004",
    "load_parameter_file",
    "save_parameter_file",
    "free_energy",
    "ensemble_free_energy",
    "isolated_pairs",
    "constraint_phi",
    "enforced_bonus",
    "ENFORCE_BONUS",
    "must_pair_positions",
    "FORBIDDEN_PHI",
    "from_dot_bracket",
    "to_dot_bracket",
    "structure_score",
    "log_prob",
    "pair_probs",
    "mixture_pair_probs",
    "best_structure",
    "mea_structure",
    "sample_structures",
    "load_params",
    "load_mixture",
    "Mixture",
    "save_params",
    "read_provenance",
    "use_all_cores",
    "release_compiled_programs",
    "ShapeWatch",
]

# Flax layers (layers/nnx_layer.py), imported on first use so that `import foldax.layers` stays free of Flax.
_LAZY = {"InsideLayer": "foldax.layers.nnx_layer", "LinenInsideLayer": "foldax.layers.nnx_layer"}
__all__ += list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'layers' has no attribute {name!r}")
