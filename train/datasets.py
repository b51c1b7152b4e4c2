"""The train / valid / test example lists of a training config (``config.data``).

Sources (``data.source``; non-empty ``data.train_files`` always means ``"files"``):

* ``"archiveii"`` -- :func:`foldax.data.archiveii.load_archiveii` from ``data.path``
  (default: ``../shared/data/archiveii/`` next to the repository, or
  ``$FOLDAX_ARCHIVEII``). ``data.fold`` holds out one family as the test split
  (``"tRNA"`` by default, as the data README recommends), the other families'
  random ``valid`` part is the validation split (see
  :func:`foldax.data.examples.fold_split_of`); ``data.fold = ""`` uses the random split.
  ``data.filtered`` keeps rows in the family lists (``in_lis``).
* ``"files"`` -- the user's own ``.dbn/.bpseq/.ct/.tsv`` files
  (:func:`foldax.data.examples.load_examples`): ``data.train_files`` (training),
  ``data.valid_files`` (validation: picks the best checkpoint) and
  ``data.eval_files`` (the *test* split: final metrics, ``foldax eval``) are
  comma-separated lists of paths, folders or globs. Without ``valid_files`` the
  validation split is the train files' random ``valid`` part
  (:func:`foldax.data.examples.split_of`, ~10% by sequence hash; those rows leave the
  training set); without ``eval_files`` the test split is their random ``test``
  part (~10%), likewise. Relative paths are relative to the current directory;
  ``foldax train`` stores them absolute in ``config.json``
  (:func:`absolute_data_paths`), so that eval and resume work from anywhere.
* ``"synthetic"`` -- random sequences with structures sampled exactly from a
  teacher model (``data.synthetic``: ``teacher`` = ``"default"`` for
  :func:`foldax.layers.default_params`, ``"random"`` for ``init_params`` with
  ``teacher_scale``, or an ``.npz``; ``lengths``; ``num_train``,
  ``num_valid``, ``num_test``; ``seed``), as :mod:`foldax.data.synthetic` does, in
  batches per length.

Cleaning (all sources): structures with a hairpin shorter than the model's
``min_hairpin`` have probability 0 under the model (an infinite loss), so
``data.short_hairpins`` either ``"drop"`` s those examples or ``"remove"`` s the
offending pairs; examples longer than ``data.max_length`` are dropped (training
and validation) -- the test split uses ``data.max_eval_length`` (default: the same).
``data.max_{train,valid,test}_examples`` keep a seeded random subset (0 = all).
``data.max_train_rows_per_family`` (0 = all) first keeps a seeded random subset of at most that
many training rows of each family (ArchiveII's ``"family"``; rows without one count as one
family), so that a few large families (5S rRNA, SRP RNA) do not make up most of what a short
fine-tuning run sees.

Cleaning for the Turner grammar (``grammar="turner"``, the ``turner`` models; train and
valid splits only, :data:`GRAMMAR_CLEANED_SPLITS`): the Turner 2004 model gives probability 0
(an infinite loss) to a structure with a non-canonical pair (anything but AU UA CG GC GU UG;
N pairs with nothing) or an interior loop / bulge of more than 30 unpaired bases
(``foldax.layers.energy_params.MAX_LOOP``). :func:`clean_for_turner` applies two rules:

* ``data.noncanonical_pairs``: ``"remove"`` those pairs from the target (the rest of the
  structure stays), ``"drop"`` the example, or ``"keep"``;
* ``data.long_loops``: ``"open"`` each such loop by removing every pair of the shorter of its
  two adjacent helices (stacked runs of pairs), until no interior loop or bulge exceeds 30
  (:func:`open_long_loops`; a removed helix merges its two loops into one, which is then
  checked again), ``"drop"`` the example, or ``"keep"``.

``"auto"`` (the default of both) means ``"remove"`` / ``"open"`` for the Turner grammar and
``"keep"`` otherwise (the stacking grammar scores every nested structure). The test split is
not cleaned this way, so that every model (and RNAfold) is scored against the same reference
structures; its ``ll_per_nt`` leaves out the structures a model cannot produce
(:func:`foldax.model.decoding.finalize`). What each rule changed is counted in the split's
provenance (:func:`describe_splits`). On ArchiveII (the 3,940 rows in the family lists) no
pair is non-canonical, and 72 structures have 79 interior loops / bulges longer than 30, all in
sequences longer than 200 nt (56 of them up to 512 nt: telomerase 31, tmRNA 16, RNase P 4,
group I intron 3, 16S rRNA 2).

Provenance: :func:`load_splits` returns a :class:`Splits` dict whose ``sources``
say where each split came from; :func:`describe_splits` prints the sizes with
them, and a validation split of fewer than :data:`SMALL_VALID` examples is
logged as a warning (the best checkpoint is picked on it).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
from collections.abc import Sequence

import numpy as np

__all__ = ["load_splits", "Splits", "describe_splits", "absolute_data_paths", "clean_examples",
           "synthetic_examples", "teacher_params", "PATH_FIELDS", "SMALL_VALID", "clean_for_turner",
           "noncanonical_pairs", "long_interior_loops", "open_long_loops", "GRAMMAR_CLEANED_SPLITS"]

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")
#: A validation split smaller than this gets a warning: the best checkpoint is picked on it.
SMALL_VALID = 20
#: Config fields holding file paths (comma-separated lists for the ``*_files``), made absolute
#: by :func:`absolute_data_paths`; the other values these fields take are names, not paths.
PATH_FIELDS = {"data.train_files": (), "data.valid_files": (), "data.eval_files": (), "data.path": (),
               "data.synthetic.teacher": ("default", "random"),
               "model.init": ("random",)}  # and the shipped parameter sets' names (_is_name)
_FILE_KEYS = {"train": "train_files", "valid": "valid_files", "test": "eval_files"}
#: The splits the grammar's own cleaning rules (``data.noncanonical_pairs``, ``data.long_loops``) apply to.
GRAMMAR_CLEANED_SPLITS = ("train", "valid")


class Splits(dict):
    """``{split: [example, ...]}`` plus ``sources``: ``{split: where its examples came from}``."""

    def __init__(self, examples=(), sources=None):
        super().__init__(examples)
        self.sources: dict[str, str] = dict(sources or {})


def describe_splits(splits) -> str:
    """One line: each split's size and where it came from.

    >>> describe_splits(Splits({"train": [1, 2], "valid": [3]}, {"train": "a.dbn", "valid": "b.dbn"}))
    'train 2 (a.dbn), valid 1 (b.dbn)'
    """
    sources = getattr(splits, "sources", {})
    return ", ".join(f"{k} {len(v)}" + (f" ({sources[k]})" if sources.get(k) else "") for k, v in splits.items())


def _absolute(path: str, base: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(path)))


def _is_name(field: str, value: str) -> bool:
    """Whether a path field's value is a name (``model.init = "turner2004"``), not a path."""
    if value in PATH_FIELDS.get(field, ()):
        return True
    if field in ("model.init", "data.synthetic.teacher"):
        from foldax.layers.params_io import ALIASES, shipped_params

        return value in ALIASES or value in shipped_params()
    return False


def absolute_data_paths(config, *, fields=None, base: str | None = None):
    """A copy of ``config`` with its path fields (:data:`PATH_FIELDS`, or just ``fields``)
    made absolute against ``base`` (default: the current directory); globs stay globs.

    A run's ``config.json`` then names the same files from any directory (eval, resume).

    >>> import ml_collections
    >>> c = ml_collections.ConfigDict({"data": {"train_files": "a.dbn, sub/*.ct", "path": ""}})
    >>> absolute_data_paths(c, base="/w").data.train_files
    '/w/a.dbn,/w/sub/*.ct'
    """
    config = copy.deepcopy(config)
    base = os.getcwd() if base is None else base
    for field in PATH_FIELDS if fields is None else fields:
        *parents, leaf = field.split(".")
        node = config
        for name in parents:
            node = node[name] if name in node else None
            if node is None:
                break
        if node is None or leaf not in node:
            continue
        value = node[leaf]
        if isinstance(value, str) and value and not _is_name(field, value):
            items = value.split(",") if leaf.endswith("_files") else [value]
            node[leaf] = ",".join(_absolute(p.strip(), base) for p in items if p.strip())
        elif isinstance(value, (list, tuple)):
            node[leaf] = type(value)(_absolute(str(p), base) for p in value)
    return config


def _paths(text) -> list[str]:
    if not text:
        return []
    if isinstance(text, str):
        return [p.strip() for p in text.split(",") if p.strip()]
    return [str(p) for p in text]


def teacher_params(spec: str, *, scale: float = 1.0, seed: int = 0):
    """Teacher parameters of a synthetic dataset: ``"default"``, ``"random"``, a shipped parameter set
    or a parameter file (:func:`foldax.layers.load_params`: ``.npz``, ``.json``, ``.par``)."""
    import jax

    from foldax import layers

    if spec == "random":
        return layers.init_params(jax.random.key(seed), scale=scale)
    return layers.load_params(spec)


def synthetic_examples(params, num: int, lengths: Sequence[int], *, seed: int, min_hairpin: int = 3,
                       prefix: str = "synthetic", batch_size: int = 256, num_chunks: int = 4) -> list[dict]:
    """``num`` random ACGU sequences (lengths cycling through ``lengths``), each with one
    structure sampled from ``params`` (:func:`foldax.layers.decoding.sample_structures`, batched per length).

    Every batch of a length has ``batch_size`` rows (the last one padded with copies of its first
    row, whose samples are dropped), so each length compiles one program: a short last batch used to
    compile another, ~20 s each. The padding rows do not change the real rows' samples (JAX's
    partitionable Threefry draws each element from its own counter)."""
    import jax

    from foldax.data.examples import make_example
    from foldax.data.formats import RnaRecord
    from foldax.data.synthetic import random_sequences
    from foldax.layers.alphabet import encode
    from foldax.layers.decoding import sample_structures
    from foldax.layers.dotbracket import validate_pair_table

    lengths = [int(lengths[i % len(lengths)]) for i in range(num)]
    seq_key, sample_key = jax.random.split(jax.random.key(seed))
    sequences = random_sequences(seq_key, lengths)
    tables: list = [None] * num
    for n in sorted(set(lengths)):
        idx = [i for i in range(num) if lengths[i] == n]
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            rows = chunk + chunk[:1] * (batch_size - len(chunk))
            tokens = np.stack([encode(sequences[i]) for i in rows])
            key = jax.random.fold_in(jax.random.fold_in(sample_key, n), start)
            out = np.asarray(sample_structures(key, params, tokens, 1, min_hairpin=min_hairpin, num_chunks=num_chunks))
            for i, table in zip(chunk, out[: len(chunk), 0], strict=True):
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


def _clean(examples: list[dict], *, min_hairpin: int, short_hairpins: str, max_length: int | None):
    """``(kept, n_long, n_short)``: the length and short-hairpin rules of the module docstring."""
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
    return out, n_long, n_short


# ----------------------------------------------------------------- Turner-grammar cleaning


def noncanonical_pairs(sequence: str, pair_table) -> np.ndarray:
    """The opening positions ``i`` of pairs ``(i, j)``, ``i < j``, that the Turner model cannot form.

    Canonical pairs are AU UA CG GC GU UG (:data:`foldax.layers.energy_params.PAIR_INDEX`); N and the other
    IUPAC codes pair with nothing.

    >>> noncanonical_pairs("GAAACAAAU", [8, 4, -1, -1, 1, -1, -1, -1, 0]).tolist()
    [1]
    """
    from foldax.layers.alphabet import encode
    from foldax.layers.energy_params import PAIR_INDEX

    table = np.asarray(pair_table)
    x = np.asarray(encode(sequence))
    idx = np.arange(len(table))
    opens = table > idx
    partner = np.where(opens, table, 0)
    return np.flatnonzero(opens & (PAIR_INDEX[x, x[partner]] < 0))


def long_interior_loops(pair_table, max_loop: int | None = None) -> list[tuple[int, int, int, int, int]]:
    """The interior loops and bulges with more than ``max_loop`` unpaired bases (default 30).

    Each as ``(i, j, k, l, unpaired)``: outer pair (i, j), inner pair (k, l), unpaired
    ``(k - i - 1) + (j - l - 1)``. O(n): every position is walked by the one loop it belongs to.

    >>> t = [-1] * 40; t[0], t[39], t[36], t[38] = 39, 0, 38, 36   # pair (0, 39) around (36, 38)
    >>> long_interior_loops(t, max_loop=30)
    [(0, 39, 36, 38, 35)]
    """
    if max_loop is None:
        from foldax.layers.energy_params import MAX_LOOP

        max_loop = MAX_LOOP
    table = np.asarray(pair_table)
    found = []
    for i in np.flatnonzero(table > np.arange(len(table))):
        i, j = int(i), int(table[i])
        branches, k = [], i + 1
        while k < j and len(branches) < 2:
            if table[k] > k:
                branches.append((k, int(table[k])))
                k = int(table[k]) + 1
            else:
                k += 1
        if len(branches) == 1:
            k, l = branches[0]
            unpaired = (k - i - 1) + (j - l - 1)
            if unpaired > max_loop:
                found.append((i, j, k, l, unpaired))
    return found


def _helix_pairs(table: np.ndarray, i: int, j: int, step: int) -> list[tuple[int, int]]:
    """The stacked run of pairs from (i, j) going outward (step -1) or inward (+1)."""
    pairs = []
    while 0 <= i < j < len(table) and table[i] == j:
        pairs.append((i, j))
        i, j = i + step, j - step
    return pairs


def open_long_loops(pair_table, max_loop: int | None = None) -> tuple[np.ndarray, int]:
    """``(table, n_removed)``: ``pair_table`` without interior loops / bulges longer than ``max_loop``.

    For each such loop the shorter of its two adjacent helices (the stacked run ending in the
    outer pair, read outward, or the one starting at the inner pair, read inward; the outer one on
    a tie) loses all its pairs; that is repeated until no loop is too long (a removed helix merges
    loops, and the merged loop is checked again). Pairs only go, so hairpins only grow and no
    non-canonical pair appears.

    >>> t = np.full(50, -1); t[[0, 1, 40]] = [49, 48, 46]; t[[49, 48, 46]] = [0, 1, 40]
    >>> table, removed = open_long_loops(t, max_loop=30)   # loop (1, 48)-(40, 46): 38 + 1 unpaired
    >>> removed, int(table[40]), int(table[1])             # the inner helix (1 pair) goes, not the outer (2)
    (1, -1, 48)
    """
    table = np.array(pair_table, dtype=np.int32)
    removed = 0
    while True:
        loops = long_interior_loops(table, max_loop)
        if not loops:
            return table, removed
        for i, j, k, l, _ in loops:
            if table[i] != j or table[k] != l:  # already opened by an earlier loop of this round
                continue
            outer, inner = _helix_pairs(table, i, j, -1), _helix_pairs(table, k, l, +1)
            for a, b in outer if len(outer) <= len(inner) else inner:
                table[a] = table[b] = -1
                removed += 1


def _grammar_policies(data_cfg, grammar: str | None) -> tuple[str, str]:
    """``(noncanonical_pairs, long_loops)`` with ``"auto"`` resolved for ``grammar``."""
    turner = grammar == "turner"
    noncanonical = data_cfg.get("noncanonical_pairs", "auto")
    long_loops = data_cfg.get("long_loops", "auto")
    if noncanonical not in ("auto", "keep", "remove", "drop"):
        raise ValueError(f"data.noncanonical_pairs must be 'auto', 'keep', 'remove' or 'drop', got {noncanonical!r}")
    if long_loops not in ("auto", "keep", "open", "drop"):
        raise ValueError(f"data.long_loops must be 'auto', 'keep', 'open' or 'drop', got {long_loops!r}")
    if noncanonical == "auto":
        noncanonical = "remove" if turner else "keep"
    if long_loops == "auto":
        long_loops = "open" if turner else "keep"
    return noncanonical, long_loops


def clean_for_turner(examples: list[dict], *, noncanonical: str = "remove", long_loops: str = "open",
                     max_loop: int | None = None) -> tuple[list[dict], dict]:
    """``(kept, counts)``: the Turner-grammar rules of the module docstring applied to ``examples``.

    ``noncanonical``: ``"remove"`` | ``"drop"`` | ``"keep"`` (``data.noncanonical_pairs``);
    ``long_loops``: ``"open"`` | ``"drop"`` | ``"keep"`` (``data.long_loops``).

    ``counts``: ``noncanonical_structures`` / ``noncanonical_pairs`` (structures with such pairs,
    and how many pairs), ``long_loop_structures`` / ``long_loops`` (structures with loops longer
    than ``max_loop`` after the non-canonical pairs went, and how many loops),
    ``long_loop_pairs_removed`` (pairs ``"open"`` removed), ``dropped`` (examples dropped by
    either rule). Changed examples are copies (``pair_table`` replaced); the others are kept as is.
    """
    counts = dict.fromkeys(("noncanonical_structures", "noncanonical_pairs", "long_loop_structures", "long_loops",
                            "long_loop_pairs_removed", "dropped"), 0)
    kept = []
    for ex in examples:
        table, changed = np.asarray(ex["pair_table"]), False
        if noncanonical != "keep":
            bad = noncanonical_pairs(ex["sequence"], table)
            if bad.size:
                counts["noncanonical_structures"] += 1
                counts["noncanonical_pairs"] += int(bad.size)
                if noncanonical == "drop":
                    counts["dropped"] += 1
                    continue
                table, changed = table.copy(), True
                table[table[bad]] = -1
                table[bad] = -1
        if long_loops != "keep":
            loops = long_interior_loops(table, max_loop)
            if loops:
                counts["long_loop_structures"] += 1
                counts["long_loops"] += len(loops)
                if long_loops == "drop":
                    counts["dropped"] += 1
                    continue
                table, removed = open_long_loops(table, max_loop)
                counts["long_loop_pairs_removed"] += removed
                changed = True
        kept.append(dict(ex, pair_table=np.asarray(table, np.int32)) if changed else ex)
    return kept, counts


def _what_grammar_changed(counts: dict, *, noncanonical: str, long_loops: str) -> str:
    """``"; 3 non-canonical pairs removed from 2 structures, ..."`` ('' when nothing changed)."""
    parts = []
    if counts["noncanonical_pairs"]:
        if noncanonical == "drop":
            parts.append(f"{counts['noncanonical_structures']} with non-canonical pairs dropped")
        else:
            parts.append(f"{counts['noncanonical_pairs']} non-canonical pairs removed from "
                         f"{counts['noncanonical_structures']} structures")
    if counts["long_loops"]:
        if long_loops == "drop":
            parts.append(f"{counts['long_loop_structures']} with interior loops > 30 dropped")
        else:
            parts.append(f"{counts['long_loops']} interior loops > 30 in {counts['long_loop_structures']} structures "
                         f"opened ({counts['long_loop_pairs_removed']} pairs removed)")
    return "; " + ", ".join(parts) if parts else ""


def _subset(examples: list[dict], limit: int, seed: int) -> list[dict]:
    """A seeded random subset of at most ``limit`` examples, in their order (0: all)."""
    if not limit or len(examples) <= limit:
        return examples
    return [examples[i] for i in _subset_positions(len(examples), limit, [seed, len(examples)])]


def _cap_per_family(examples: list[dict], limit: int, seed: int) -> tuple[list[dict], str]:
    """At most ``limit`` examples of each ``"family"`` (a seeded subset per family, the order kept;
    0: all), and a ``"; at most N rows per family (5s 1283 -> N, ...)"`` note of what it cut."""
    if limit < 0:
        raise ValueError(f"config.data.max_train_rows_per_family must be >= 0 (0 = all), got {limit}")
    if not limit:
        return examples, ""
    by_family: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        by_family.setdefault(str(example.get("family", "")), []).append(index)
    keep, cut = set(), []
    for family, indices in sorted(by_family.items()):
        # Seeded by the family's name: a family keeps the same rows whichever others are present.
        family_seed = int.from_bytes(hashlib.sha256(family.encode()).digest()[:4], "little")
        keep.update(indices[i] for i in _subset_positions(len(indices), limit, [seed, family_seed]))
        if len(indices) > limit:
            cut.append(f"{family or 'no family'} {len(indices)} -> {limit}")
    note = f"; at most {limit} rows per family ({', '.join(cut)})" if cut else ""
    return [ex for index, ex in enumerate(examples) if index in keep], note


def _subset_positions(n: int, limit: int, seed) -> np.ndarray:
    """Sorted positions of a seeded random subset of ``min(n, limit)`` of ``range(n)``."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])


def clean_examples(examples: list[dict], *, min_hairpin: int, short_hairpins: str = "drop",
                   max_length: int | None = None, limit: int = 0, seed: int = 0, name: str = "") -> list[dict]:
    """Applies the cleaning rules of the module docstring; logs what was dropped."""
    out, n_long, n_short = _clean(examples, min_hairpin=min_hairpin, short_hairpins=short_hairpins,
                                  max_length=max_length)
    out = _subset(out, limit, seed)
    log.info("%s: %d examples (%d longer than %s dropped, %d with hairpins <= %d %s)", name, len(out), n_long,
             max_length, n_short, min_hairpin, "dropped" if short_hairpins == "drop" else "cleaned")
    return out


def _what_was_dropped(n_raw, n_long, n_short, n_kept, *, max_length, min_hairpin, short_hairpins, limit_key):
    """``"; 2 longer than 200 dropped, ..."`` for a split's provenance ('' when all were kept)."""
    parts = []
    if n_long:
        parts.append(f"{n_long} longer than {max_length} dropped")
    if n_short and short_hairpins == "drop":
        parts.append(f"{n_short} with a hairpin <= {min_hairpin} dropped")
    n_clean = n_raw - n_long - (n_short if short_hairpins == "drop" else 0)
    if n_kept < n_clean:
        parts.append(f"{n_kept} of {n_clean} kept by config.data.{limit_key}")
    return "; " + ", ".join(parts) if parts else ""


def _shown(paths: list[str], limit: int = 3) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _load_files(data_cfg, key: str):
    """``load_examples`` of ``config.data.<key>``; a missing file names the field and the directory."""
    from foldax.data.examples import load_examples

    paths = _paths(data_cfg.get(key, ""))
    try:
        examples, report = load_examples(paths)
    except FileNotFoundError as err:
        relative = [p for p in paths if not os.path.isabs(os.path.expanduser(p))]
        where = f" (relative paths are read from the current directory, {os.getcwd()})" if relative else ""
        raise FileNotFoundError(f"config.data.{key}: {err}{where}; fix the path, e.g. "
                                f"--config.data.{key}=/absolute/path.dbn") from None
    log.info("%s: %s", key, report.summary())
    return examples, f"config.data.{key}: {_shown(paths)}"


#: ``data.valid_families = "auto"``: the first of these that is not the held-out family. ArchiveII's rows of
#: up to 200 nt are nearly all 5S rRNA, SRP RNA and tRNA, so one of them validates and the others train.
AUTO_VALID_FAMILIES = ("tRNA", "srp")


def validation_families(spec: str, fold: str | None) -> tuple[str, ...]:
    """The families ``data.valid_families`` names for held-out family ``fold`` (``()``: the
    other families' random ``valid`` rows, the default). ``"auto"`` picks one family of short
    sequences (:data:`AUTO_VALID_FAMILIES`), so that validation is cheap.

    >>> validation_families("auto", "tRNA"), validation_families("auto", "5s"), validation_families("5s,grp1", "tRNA")
    (('srp',), ('tRNA',), ('5s', 'grp1'))
    """
    from foldax.data.archiveii import FAMILIES

    spec = (spec or "").strip()
    if not spec or not fold:
        return ()
    if spec == "auto":
        return tuple(f for f in AUTO_VALID_FAMILIES if f != fold)[:1]
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(f"config.data.valid_families: unknown famil{'ies' if len(unknown) > 1 else 'y'} "
                         f"{', '.join(unknown)} (ArchiveII's: {', '.join(FAMILIES)}, or 'auto')")
    if fold in names:
        raise ValueError(f"config.data.valid_families = {spec!r} holds the held-out family {fold!r} (config.data.fold)")
    return names


def _raw_splits(data_cfg, min_hairpin: int) -> Splits:
    from foldax.data.examples import split_of

    source = "files" if _paths(data_cfg.get("train_files", "")) else data_cfg.get("source", "archiveii")
    if source == "archiveii":
        from foldax.data.archiveii import load_archiveii

        fold = data_cfg.get("fold", "tRNA") or None
        examples = load_archiveii(data_cfg.get("path", "") or None, fold=fold)
        if data_cfg.get("filtered", True):
            examples = [ex for ex in examples if ex["in_lis"]]
        from foldax.data.examples import fold_split_of

        valid_families = validation_families(data_cfg.get("valid_families", ""), fold)
        if fold and valid_families:
            names = ", ".join(valid_families)
            sources = {"train": f"ArchiveII without {fold} and the validation families ({names})",
                       "valid": f"ArchiveII families {names} (whole families, none trained on)",
                       "test": f"ArchiveII family {fold}, held out"}
        elif fold:
            sources = {"train": f"ArchiveII without {fold}, less the other families' random 'valid' part",
                       "valid": f"ArchiveII without {fold}: the random 'valid' part of the other families",
                       "test": f"ArchiveII family {fold}, held out"}
        else:
            sources = {s: f"ArchiveII random split '{s}'" for s in SPLIT_NAMES}
        return Splits({s: [ex for ex in examples if fold_split_of(ex, fold, valid_families) == s]
                       for s in SPLIT_NAMES}, sources)
    if source == "files":
        train, train_source = _load_files(data_cfg, "train_files")
        splits, sources = {"train": train}, {"train": train_source}
        carved = []
        for split in ("valid", "test"):
            key = _FILE_KEYS[split]
            if _paths(data_cfg.get(key, "")):
                splits[split], sources[split] = _load_files(data_cfg, key)
            else:
                splits[split] = [ex for ex in train if split_of(ex["sequence"]) == split]
                splits["train"] = [ex for ex in splits["train"] if split_of(ex["sequence"]) != split]
                sources[split] = (f"carved from config.data.train_files by sequence hash (~10%); "
                                  f"set config.data.{key} to choose")
                carved.append(split)
        if carved:
            sources["train"] += f", less the {' and '.join(carved)} part{'s' if len(carved) > 1 else ''}"
        return Splits(splits, sources)
    if source == "synthetic":
        syn = data_cfg.synthetic
        params = teacher_params(syn.teacher, scale=float(syn.get("teacher_scale", 1.0)), seed=int(syn.seed))
        out = {}
        for k, split in enumerate(SPLIT_NAMES):
            out[split] = synthetic_examples(params, int(syn.get(f"num_{split}")), list(syn.lengths),
                                            seed=int(syn.seed) * 1000 + k + 1, min_hairpin=min_hairpin,
                                            prefix=f"synthetic_{split}")
        return Splits(out, {s: f"synthetic, sampled from teacher {syn.teacher!r}" for s in SPLIT_NAMES})
    raise ValueError(f"unknown data.source {source!r}; one of 'archiveii', 'files', 'synthetic'")


def load_splits(data_cfg, *, min_hairpin: int, seed: int = 0, splits: Sequence[str] = SPLIT_NAMES,
                grammar: str | None = None) -> Splits:
    """``{"train": [...], "valid": [...], "test": [...]}`` (example dicts) for ``config.data``.

    ``grammar`` (``"stacking"``, ``"turner"``; :func:`foldax.model.models.grammar_of` of
    ``config.model``) resolves ``data.noncanonical_pairs`` / ``data.long_loops = "auto"``
    (module docstring). The result's ``sources`` say where each split came from and what the
    cleaning changed (:func:`describe_splits`); a validation split smaller than
    :data:`SMALL_VALID` is logged as a warning.
    """
    raw = _raw_splits(data_cfg, min_hairpin)
    max_length = int(data_cfg.get("max_length", 0)) or None
    max_eval = int(data_cfg.get("max_eval_length", 0)) or max_length
    short_hairpins = data_cfg.get("short_hairpins", "drop")
    noncanonical, long_loops = _grammar_policies(data_cfg, grammar)
    out = Splits()
    for split in splits:
        examples = raw[split]
        if split == "train" and data_cfg.get("drop_duplicates", False):
            examples = [ex for ex in examples if not ex.get("dup_of")]
        length = max_eval if split == "test" else max_length
        kept, n_long, n_short = _clean(examples, min_hairpin=min_hairpin, short_hairpins=short_hairpins,
                                       max_length=length)
        n_clean, grammar_note = len(kept), ""
        if split in GRAMMAR_CLEANED_SPLITS and (noncanonical, long_loops) != ("keep", "keep"):
            kept, counts = clean_for_turner(kept, noncanonical=noncanonical, long_loops=long_loops)
            grammar_note = _what_grammar_changed(counts, noncanonical=noncanonical, long_loops=long_loops)
            if grammar_note:
                log.info("%s: %s", split, grammar_note[2:])
        family_note = ""
        if split == "train":
            kept, family_note = _cap_per_family(kept, int(data_cfg.get("max_train_rows_per_family", 0)), seed)
        # Seeded by the split's name, not its position in `splits`: loading one split (eval)
        # keeps the same subset as loading all three (training).
        out[split] = _subset(kept, int(data_cfg.get(f"max_{split}_examples", 0)), seed + SPLIT_NAMES.index(split))
        log.info("%s: %d examples (%d longer than %s dropped, %d with hairpins <= %d %s)", split, len(out[split]),
                 n_long, length, n_short, min_hairpin, "dropped" if short_hairpins == "drop" else "cleaned")
        out.sources[split] = raw.sources[split] + _what_was_dropped(
            len(examples) - (n_clean - len(kept)), n_long, n_short, len(out[split]), max_length=length,
            min_hairpin=min_hairpin, short_hairpins=short_hairpins, limit_key=f"max_{split}_examples") + grammar_note \
            + family_note
        if not out[split]:
            raise ValueError(f"the {split} split is empty after cleaning ({out.sources[split]}; {len(examples)} "
                             f"before cleaning); check config.data")
    log.info("data: %s", describe_splits(out))
    if "valid" in out and len(out["valid"]) < SMALL_VALID:
        log.warning("the validation split has only %d example(s) (%s): the best checkpoint is picked on them, so "
                    "the choice is noisy; give more (config.data.valid_files, config.data.max_valid_examples)",
                    len(out["valid"]),
                    out.sources["valid"])
    return out
