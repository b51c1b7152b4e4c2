"""The train / valid / test example lists of a training config (``config.data``).

Sources (``data.source``; non-empty ``data.train_files`` always means ``"files"``):

* ``"archiveii"`` -- :func:`data.archiveii.load_archiveii` from ``data.path``
  (default: ``../shared/data/archiveii/`` next to the repository, or
  ``$FOLDAX_ARCHIVEII``). ``data.fold`` holds out one family as the test split
  (``"tRNA"`` by default, as the data README recommends), the other families'
  random ``valid`` part is the validation split (see
  :func:`data.examples.fold_split_of`); ``data.fold = ""`` uses the random split.
  ``data.filtered`` keeps rows in the family lists (``in_lis``).
* ``"files"`` -- the user's own ``.dbn/.bpseq/.ct/.tsv`` files
  (:func:`data.examples.load_examples`): ``data.train_files``,
  ``data.valid_files`` and ``data.eval_files`` are comma-separated lists of
  paths, folders or globs. Without ``valid_files`` the validation split is the
  train files' random ``valid`` part (:func:`data.examples.split_of`, by
  sequence hash; those rows leave the training set); without ``eval_files``
  the test split is their random ``test`` part, likewise.
* ``"synthetic"`` -- random sequences with structures sampled exactly from a
  teacher model (``data.synthetic``: ``teacher`` = ``"default"`` for
  :func:`layers.default_params`, ``"random"`` for ``init_params`` with
  ``teacher_scale``, or an ``.npz``; ``lengths``; ``num_train``,
  ``num_valid``, ``num_test``; ``seed``), as :mod:`data.synthetic` does, in
  batches per length.

Cleaning (all sources): structures with a hairpin shorter than the model's
``min_hairpin`` have probability 0 under the model (an infinite loss), so
``data.short_hairpins`` either ``"drop"`` s those examples or ``"remove"`` s the
offending pairs; examples longer than ``data.max_length`` are dropped (training
and validation) -- the test split uses ``data.max_eval_length`` (default: the same).
``data.max_{train,valid,test}_examples`` keep a seeded random subset (0 = all).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

__all__ = ["load_splits", "clean_examples", "synthetic_examples", "teacher_params"]

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")


def _paths(text) -> list[str]:
    if not text:
        return []
    if isinstance(text, str):
        return [p.strip() for p in text.split(",") if p.strip()]
    return [str(p) for p in text]


def teacher_params(spec: str, *, scale: float = 1.0, seed: int = 0):
    """Teacher parameters of a synthetic dataset: ``"default"``, ``"random"`` or an ``.npz`` path."""
    import jax

    import layers

    if spec == "default":
        return layers.default_params()
    if spec == "random":
        return layers.init_params(jax.random.key(seed), scale=scale)
    with np.load(spec) as f:
        return {k: np.asarray(f[k], np.float32) for k in ("stack", "pair", "unpaired", "loop")}


def synthetic_examples(params, num: int, lengths: Sequence[int], *, seed: int, min_hairpin: int = 3,
                       prefix: str = "synthetic", batch_size: int = 256, num_chunks: int = 4) -> list[dict]:
    """``num`` random ACGU sequences (lengths cycling through ``lengths``), each with one
    structure sampled from ``params`` (:func:`layers.decoding.sample_structures`, batched per length)."""
    import jax

    from data.examples import make_example
    from data.formats import RnaRecord
    from data.synthetic import random_sequences
    from layers.alphabet import encode
    from layers.decoding import sample_structures
    from layers.dotbracket import validate_pair_table

    lengths = [int(lengths[i % len(lengths)]) for i in range(num)]
    seq_key, sample_key = jax.random.split(jax.random.key(seed))
    sequences = random_sequences(seq_key, lengths)
    tables: list = [None] * num
    for n in sorted(set(lengths)):
        idx = [i for i in range(num) if lengths[i] == n]
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            tokens = np.stack([encode(sequences[i]) for i in chunk])
            key = jax.random.fold_in(jax.random.fold_in(sample_key, n), start)
            out = np.asarray(sample_structures(key, params, tokens, 1, min_hairpin=min_hairpin, num_chunks=num_chunks))
            for i, table in zip(chunk, out[:, 0]):
                tables[i] = validate_pair_table(table, min_hairpin=min_hairpin, nested=True)
    examples = []
    for i, (sequence, table) in enumerate(zip(sequences, tables)):
        ex = make_example(RnaRecord(f"{prefix}_{i}", sequence, table, source=f"synthetic:{seed}:{i}"),
                          family="synthetic")
        examples.append(ex)
    return examples


def _remove_short_hairpins(ex: dict, min_hairpin: int) -> dict:
    table = np.array(ex["pair_table"], dtype=np.int32)
    idx = np.arange(len(table))
    bad = (table >= 0) & (np.abs(table - idx) <= min_hairpin)
    table[bad] = -1
    return dict(ex, pair_table=table)


def clean_examples(examples: list[dict], *, min_hairpin: int, short_hairpins: str = "drop",
                   max_length: int | None = None, limit: int = 0, seed: int = 0, name: str = "") -> list[dict]:
    """Applies the cleaning rules of the module docstring; logs what was dropped."""
    if short_hairpins not in ("drop", "remove"):
        raise ValueError(f"data.short_hairpins must be 'drop' or 'remove', got {short_hairpins!r}")
    out, n_long, n_short = [], 0, 0
    for ex in examples:
        if max_length and ex["length"] > max_length:
            n_long += 1
            continue
        table = np.asarray(ex["pair_table"])
        idx = np.arange(len(table))
        if np.any((table > idx) & (table - idx <= min_hairpin)):
            n_short += 1
            if short_hairpins == "drop":
                continue
            ex = _remove_short_hairpins(ex, min_hairpin)
        out.append(ex)
    if limit and len(out) > limit:
        keep = np.sort(np.random.default_rng([seed, len(out)]).permutation(len(out))[:limit])
        out = [out[i] for i in keep]
    log.info("%s: %d examples (%d longer than %s dropped, %d with hairpins <= %d %s)", name, len(out), n_long,
             max_length, n_short, min_hairpin, "dropped" if short_hairpins == "drop" else "cleaned")
    return out


def _raw_splits(data_cfg, min_hairpin: int) -> dict[str, list[dict]]:
    from data.examples import load_examples, split_of

    source = "files" if _paths(data_cfg.get("train_files", "")) else data_cfg.get("source", "archiveii")
    if source == "archiveii":
        from data.archiveii import load_archiveii

        fold = data_cfg.get("fold", "tRNA") or None
        examples = load_archiveii(data_cfg.get("path", "") or None, fold=fold)
        if data_cfg.get("filtered", True):
            examples = [ex for ex in examples if ex["in_lis"]]
        from data.examples import fold_split_of

        return {s: [ex for ex in examples if fold_split_of(ex, fold) == s] for s in SPLIT_NAMES}
    if source == "files":
        train, report = load_examples(_paths(data_cfg.train_files))
        log.info("train files: %s", report.summary())
        splits = {"train": train}
        for split, key in (("valid", "valid_files"), ("test", "eval_files")):
            paths = _paths(data_cfg.get(key, ""))
            if paths:
                splits[split], report = load_examples(paths)
                log.info("%s files: %s", split, report.summary())
            else:
                splits[split] = [ex for ex in train if split_of(ex["sequence"]) == split]
                splits["train"] = [ex for ex in splits["train"] if split_of(ex["sequence"]) != split]
        return splits
    if source == "synthetic":
        syn = data_cfg.synthetic
        params = teacher_params(syn.teacher, scale=float(syn.get("teacher_scale", 1.0)), seed=int(syn.seed))
        out = {}
        for k, split in enumerate(SPLIT_NAMES):
            out[split] = synthetic_examples(params, int(syn.get(f"num_{split}")), list(syn.lengths),
                                            seed=int(syn.seed) * 1000 + k + 1, min_hairpin=min_hairpin,
                                            prefix=f"synthetic_{split}")
        return out
    raise ValueError(f"unknown data.source {source!r}; one of 'archiveii', 'files', 'synthetic'")


def load_splits(data_cfg, *, min_hairpin: int, seed: int = 0, splits: Sequence[str] = SPLIT_NAMES
                ) -> dict[str, list[dict]]:
    """``{"train": [...], "valid": [...], "test": [...]}`` (example dicts) for ``config.data``."""
    raw = _raw_splits(data_cfg, min_hairpin)
    max_length = int(data_cfg.get("max_length", 0)) or None
    max_eval = int(data_cfg.get("max_eval_length", 0)) or max_length
    out = {}
    for k, split in enumerate(splits):
        examples = raw[split]
        if split == "train" and data_cfg.get("drop_duplicates", False):
            examples = [ex for ex in examples if not ex.get("dup_of")]
        out[split] = clean_examples(
            examples, min_hairpin=min_hairpin, short_hairpins=data_cfg.get("short_hairpins", "drop"),
            max_length=max_eval if split == "test" else max_length,
            limit=int(data_cfg.get(f"max_{split}_examples", 0)), seed=seed + k, name=split,
        )
        if not out[split]:
            raise ValueError(f"the {split} split is empty after cleaning; check config.data")
    return out
