"""Synthetic data: random sequences with structures sampled exactly from a model.

Sequences are drawn i.i.d. per position (uniform over ``ACGU`` or from given
base frequencies); for each one, structures are drawn from the model's
Boltzmann distribution ``p(s | x) ∝ exp(score(s))`` with
``layers.sample_structures`` (an exact stochastic traceback). Data generated
from known parameters is the ground truth for checking that training recovers
them.

>>> import jax
>>> [len(s) for s in random_sequences(jax.random.key(0), [5, 3])]
[5, 3]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from foldax.data.formats import RnaRecord
from foldax.layers.alphabet import encode
from foldax.layers.dotbracket import validate_pair_table

__all__ = ["random_sequences", "synthetic_records"]

_BASES = "ACGU"


def _lengths(num_sequences: int, lengths: int | Sequence[int]) -> list[int]:
    if isinstance(lengths, int):
        return [lengths] * num_sequences
    lengths = [int(n) for n in lengths]
    if len(lengths) != num_sequences:
        raise ValueError(f"{len(lengths)} lengths given for {num_sequences} sequences")
    return lengths


def random_sequences(key, lengths: Sequence[int], base_probs: Sequence[float] | None = None) -> list[str]:
    """One random ``ACGU`` string per length; ``base_probs`` = P(A, C, G, U) (default uniform)."""
    import jax

    probs = None
    if base_probs is not None:
        probs = np.asarray(base_probs, dtype=np.float64)
        if probs.shape != (4,) or (probs < 0).any() or not np.isclose(probs.sum(), 1.0):
            raise ValueError(f"base_probs must be 4 non-negative numbers summing to 1, got {base_probs}")
    keys = jax.random.split(key, len(lengths))
    return [
        "".join(_BASES[t] for t in np.asarray(jax.random.choice(k, 4, shape=(n,), p=probs)).tolist())
        for k, n in zip(keys, lengths)
    ]


def synthetic_records(
    key,
    params,
    num_sequences: int,
    lengths: int | Sequence[int],
    *,
    samples_per_sequence: int = 1,
    base_probs: Sequence[float] | None = None,
    phi=None,
    min_hairpin: int = 3,
    id_prefix: str = "synthetic",
) -> list[RnaRecord]:
    """Random sequences, each with ``samples_per_sequence`` structures sampled from ``params``.

    Args:
      key: a JAX PRNG key (sequences and structures are split from it).
      params: model parameters, as for ``layers.log_partition``.
      num_sequences: how many sequences.
      lengths: one length for all, or one per sequence.
      samples_per_sequence: structures per sequence (one record each, ids
        ``<id_prefix>_<sequence>_<sample>``).
      base_probs: P(A, C, G, U); default uniform.
      phi, min_hairpin: passed to ``layers.sample_structures``.

    Every sampled pair table is checked (nested, symmetric, hairpins of at least
    ``min_hairpin``); a violation raises ``ValueError``. Use
    :func:`foldax.data.examples.make_example` for the dataset features (family
    ``"synthetic"`` with ``family=...``).
    """
    import jax

    from foldax.layers import sample_structures  # lazily: the sampler lives in the engine

    seq_key, sample_key = jax.random.split(key)
    sequences = random_sequences(seq_key, _lengths(num_sequences, lengths), base_probs)
    records = []
    for i, (sequence, k) in enumerate(zip(sequences, jax.random.split(sample_key, num_sequences))):
        tables = np.asarray(
            sample_structures(k, params, encode(sequence), samples_per_sequence, phi=phi, min_hairpin=min_hairpin)
        )
        if tables.shape != (samples_per_sequence, len(sequence)):
            raise ValueError(f"sample_structures returned shape {tables.shape}, "
                             f"expected {(samples_per_sequence, len(sequence))}")
        for s, table in enumerate(tables):
            validate_pair_table(table, min_hairpin=min_hairpin, nested=True)
            records.append(RnaRecord(f"{id_prefix}_{i}_{s}", sequence, table, source=f"synthetic:{i}"))
    return records
