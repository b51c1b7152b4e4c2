"""Examples: the feature dicts every dataset (ArchiveII, a user's files) yields.

One example is a plain dict with these keys:

=================  =========  ================================================
key                type       meaning
=================  =========  ================================================
id                 str        record id (file stem for ArchiveII)
family             str        family label ('' if unknown)
sequence           str        upper case, ``T`` -> ``U``
length             int        number of nucleotides
pair_table         int32 [n]  a maximum nested subset of the pairs (training
                              target for a nested DP; see
                              :func:`foldax.layers.dotbracket.max_nested_subset`)
full_pair_table    int32 [n]  every pair, crossing ones included
pseudoknot         bool       whether any two pairs of ``full_pair_table`` cross
n_pk_removed       int        pairs dropped to make ``pair_table``
n_short_hairpin    int        pairs (i, j) with j - i - 1 < 3 (probability zero
                              under a model with minimum hairpin 3)
random_split       str        'train' / 'valid' / 'test' (:func:`split_of`)
dup_of             str        id of the first example (in id order) with the same
                              sequence, '' for a first occurrence
source             str        ``file:line`` the record came from
=================  =========  ================================================

ArchiveII examples add ``in_lis`` (bool), see :mod:`foldax.data.archiveii`.

>>> from foldax.data.formats import parse_records
>>> [rec] = parse_records(">x_1\\nGGGAAACCC\\n(((...)))\\n", "dbn")
>>> ex = make_example(rec)
>>> ex["family"], ex["length"], ex["pseudoknot"], ex["random_split"]
('x', 9, False, 'train')
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from foldax.data.formats import LoadReport, RnaRecord, load_records
from foldax.layers.dotbracket import count_short_hairpins, max_nested_subset

__all__ = [
    "SPLITS",
    "RANDOM_SPLIT_PERCENT",
    "family_of",
    "split_of",
    "fold_split_of",
    "make_example",
    "mark_duplicates",
    "load_examples",
]

SPLITS = ("train", "valid", "test")
#: Percentages of the sequence-hash split, as in ``shared/data/tools/convert.py``.
RANDOM_SPLIT_PERCENT = (80, 10, 10)


def family_of(record_id: str) -> str:
    """ArchiveII convention: the family is the id's prefix before the first ``_``.

    >>> family_of("tRNA_tdbR00000001-Halobacterium"), family_of("16s_E.coli_domain2")
    ('tRNA', '16s')
    """
    return record_id.split("_", 1)[0]


def split_of(sequence: str) -> str:
    """Deterministic ~80/10/10 split from the SHA-256 of the sequence.

    ``int(sha256(sequence).hexdigest(), 16) % 100`` below 80 is ``train``,
    below 90 ``valid``, else ``test`` -- the rule that produced the
    ``random_split`` column of ``archiveii.tsv``. Identical sequences always
    share a split, so duplicates cannot leak between train and test.

    >>> split_of("GGGAAACCC")
    'train'
    """
    bucket = int(hashlib.sha256(sequence.encode()).hexdigest(), 16) % 100
    train, valid, _ = RANDOM_SPLIT_PERCENT
    return "train" if bucket < train else ("valid" if bucket < train + valid else "test")


def fold_split_of(example: dict, held_out: str | None, valid_families: tuple[str, ...] = ()) -> str:
    """The split of an example in a leave-one-family-out fold.

    ``held_out=None`` gives the random split. Otherwise the held-out family is
    ``test``, and the other families' examples are ``valid`` when their random
    split is ``valid`` and ``train`` otherwise (their random ``test`` part
    included), as recommended in ``shared/data/archiveii/README.md``. With
    ``valid_families``, validation is those whole families instead (none of their
    rows is trained on): the best checkpoint is then chosen by how the model does
    on families it did not train on, as the held-out family will judge it.

    >>> fold_split_of({"family": "tRNA", "random_split": "train"}, "tRNA")
    'test'
    >>> fold_split_of({"family": "5s", "random_split": "test"}, "tRNA")
    'train'
    >>> fold_split_of({"family": "srp", "random_split": "train"}, "tRNA", ("srp",))
    'valid'
    """
    if held_out is None:
        return example["random_split"]
    if example["family"] == held_out:
        return "test"
    if valid_families:
        return "valid" if example["family"] in valid_families else "train"
    return "valid" if example["random_split"] == "valid" else "train"


def make_example(record: RnaRecord, *, family: str | None = None) -> dict:
    """The feature dict of one record (see the module docstring).

    ``family`` defaults to :func:`family_of` the id. ``dup_of`` is left empty;
    :func:`mark_duplicates` fills it across a dataset.
    """
    if record.pair_table is None:
        raise ValueError(f"{record.source}: record {record.id!r} has no structure")
    full = np.asarray(record.pair_table, dtype=np.int32)
    nested = max_nested_subset(full)
    n_full, n_nested = (int(np.count_nonzero(t >= 0)) // 2 for t in (full, nested))
    return {
        "id": record.id,
        "family": family_of(record.id) if family is None else family,
        "sequence": record.sequence,
        "length": record.length,
        "pair_table": nested,
        "full_pair_table": full.copy(),
        "pseudoknot": n_nested != n_full,
        "n_pk_removed": n_full - n_nested,
        "n_short_hairpin": count_short_hairpins(full),
        "random_split": split_of(record.sequence),
        "dup_of": "",
        "source": record.source,
    }


def mark_duplicates(examples: Sequence[dict]) -> None:
    """Sets ``dup_of`` in place: the first id (in sorted id order) with the same sequence."""
    first: dict[str, str] = {}
    for ex in sorted(examples, key=lambda e: e["id"]):
        owner = first.setdefault(ex["sequence"], ex["id"])
        ex["dup_of"] = "" if owner == ex["id"] else owner


def load_examples(
    paths_or_globs: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    strict: bool = True,
    pseudoknots: str = "reduce",
    family: str | Callable[[RnaRecord], str] | None = None,
) -> tuple[list[dict], LoadReport]:
    """Examples from a user's own .dbn/.bpseq/.ct/.tsv files (any mix, globs, folders).

    Same features as ArchiveII (less ``in_lis``). ``pseudoknots``: ``"reduce"``
    and ``"keep"`` both keep pseudoknotted records (``pair_table`` is the
    nested subset, ``full_pair_table`` has every pair; ``"reduce"`` also counts
    them in the report), ``"skip"`` drops them (counted), ``"error"`` raises.
    ``family``: a fixed label, a function of the record, or None for the id
    prefix before ``_``. Records without a structure (FASTA) are an error.
    """
    policy = "keep" if pseudoknots == "reduce" else pseudoknots
    records, report = load_records(paths_or_globs, strict=strict, pseudoknots=policy)
    examples = [make_example(r, family=family(r) if callable(family) else family) for r in records]
    if pseudoknots == "reduce":
        reduced = [ex for ex in examples if ex["pseudoknot"]]
        report.pseudoknots_reduced += len(reduced)
        report.pairs_removed += sum(ex["n_pk_removed"] for ex in reduced)
    mark_duplicates(examples)
    return examples, report
