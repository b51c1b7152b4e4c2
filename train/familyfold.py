"""Family-fold cross-validation on ArchiveII: one model per held-out family, foldax beside RNAfold.

Usage (also as ``foldax familyfold ...``)::

    python -m foldax.train.familyfold --config configs/default.py --workdir runs/ff [--config.a.b=VALUE ...]
        [--families tRNA,5s] [--max-eval-length N] [--no-rnafold] [--max-batch-cells C]

For every ArchiveII family ``f`` (:data:`foldax.data.archiveii.FAMILIES`, or ``--families``):

1. **Train** with ``f`` held out: the config with ``data.fold = f`` goes to
   :func:`foldax.train.train.train_and_evaluate` in ``<workdir>/<f>/`` (a normal training
   workdir: ``foldax eval``, ``foldax.train.compare`` and ``foldax fold --params`` work on
   it). Its splits come from :func:`foldax.data.examples.fold_split_of`: test = family
   ``f``; validation = the *other* families' random ``valid`` rows; train = the
   rest of the other families. So the best checkpoint (the only choice made
   from data during training: ``config.best_metric`` on the validation split)
   never sees family ``f``. Each family's run checks this before it trains (no
   example of ``f`` in its train or validation split, else an error) and counts
   the test sequences that also occur in them (``checks``; none in ArchiveII,
   where no sequence is in two families).
2. **Evaluate** its best checkpoint on family ``f`` with :func:`foldax.train.compare.compare`:
   foldax MEA (``config.gamma``), foldax best structure, and RNAfold (ViennaRNA,
   MFE, 37 C) on the same sequences, each against the same nested reference
   pair tables: F1, F1 +-1 (slip), MCC, precision, recall, as per-sequence means
   (:mod:`foldax.model.metrics`).

Evaluation policy for long sequences. ``config.data.max_length`` caps the
*training and validation* rows (200 nt by default); the held-out family is
evaluated at **full length**: every sequence that passes the config's data
filter (``data.filtered``: in ArchiveII's family lists; ``data.short_hairpins
= "drop"``: no hairpin shorter than ``model.min_hairpin``), however long. Each
family's run gets ``data.max_eval_length`` = its longest such sequence and
evaluation buckets beyond ``data.eval_buckets`` as needed (:func:`extra_buckets`).
With the default filter the longest is 780 nt (group II intron); ArchiveII's
full-length 16S/23S rRNAs (up to 2,968 nt) are not in its family lists (their
domains are) and are reported as left out. ``--max-eval-length N`` leaves out
longer sequences instead. The table states the policy and, per family, what
was left out and why. Evaluation batches stay under ``--max-batch-cells`` chart
cells (rows x length^2; ~120 bytes each in float32), so very long sequences
are folded a few at a time.

Outputs in ``--workdir``:

* ``familyfold.json`` -- per family (``families``) and as means over the
  families (``mean``; also ``pooled``: every sequence weighted equally) the
  metrics of each method, with per-family training facts, left-out counts,
  checks and per-sequence F1; ``complete`` says whether all ten families are in.
* ``familyfold.md`` -- the markdown tables (also printed).
* ``familyfold_config.json`` -- the config and options of the run (a rerun
  must match them); ``rnafold_cache.jsonl`` -- RNAfold's structure per sequence
  (:class:`foldax.train.compare.RnafoldCache`).
* ``<f>/`` -- family ``f``'s training workdir and ``<f>/familyfold_family.json``,
  its finished evaluation.

Resuming: run the same command again. Families with ``familyfold_family.json``
are taken as they are; a family whose training finished (``summary.json``) is
only evaluated; a half-trained family resumes from its latest checkpoint
(:func:`foldax.train.train.train_and_evaluate`); RNAfold folds only sequences not in
the cache. SIGTERM during training saves a checkpoint and stops cleanly.

:func:`main` ``(argv)`` returns the exit status: 0 done (also after a clean
SIGTERM stop), 1 error (message on stderr), 2 usage.

>>> extra_buckets((64, 128), [30, 200, 700, 1500, 2968])
(256, 768, 1536, 3072)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

import numpy as np

__all__ = [
    "FAMILY_NAMES",
    "DEFAULT_MAX_BATCH_CELLS",
    "familyfold",
    "family_config",
    "extra_buckets",
    "aggregate",
    "format_markdown",
    "main",
]

log = logging.getLogger("foldax.familyfold")

#: Display names of the ArchiveII family codes.
FAMILY_NAMES = {
    "5s": "5S rRNA", "srp": "SRP RNA", "tRNA": "tRNA", "tmRNA": "tmRNA", "RNaseP": "RNase P RNA",
    "grp1": "group I intron", "16s": "16S rRNA", "telomerase": "telomerase RNA", "23s": "23S rRNA",
    "grp2": "group II intron",
}
#: Default cap on the chart cells of one evaluation batch (2^25 cells: about 4 GB in float32).
DEFAULT_MAX_BATCH_CELLS = 2**25
METHODS = ("mea", "best", "rnafold")
#: Metrics of the tables: (key, header).
TABLE_METRICS = (("f1", "F1"), ("f1_slip", "F1 +-1"), ("mcc", "MCC"), ("precision", "precision"),
                 ("recall", "recall"))
#: Config fields that do not change a result; a rerun may change them.
VOLATILE_FIELDS = ("progress_bar", "compilation_cache_dir", "async_checkpointing", "log_every",
                   "data.num_threads", "data.prefetch",
                   "eval_test")  # set per fold by --cross-check
RESULT_NAME = "familyfold_family.json"


# ------------------------------------------------------------------------ config


def extra_buckets(buckets, lengths) -> tuple[int, ...]:
    """Evaluation buckets to add above ``max(buckets)`` so that every length in ``lengths`` fits.

    Only buckets some sequence needs: ``ceil(L / step) * step`` with ``step`` 128 up to
    1,024 nt, 256 up to 2,048 nt and 512 beyond (each bucket costs a compilation).
    """
    top = max(int(b) for b in buckets)
    out = set()
    for n in lengths:
        n = int(n)
        if n > top:
            step = 128 if n <= 1024 else (256 if n <= 2048 else 512)
            out.add(max(top + 1, math.ceil(n / step) * step))
    return tuple(sorted(out))


def check_config(config) -> None:
    """Family folds need ArchiveII data (``data.source = "archiveii"``, no ``data.train_files``)."""
    data = config.data
    if data.get("source", "archiveii") != "archiveii" or data.get("train_files", ""):
        raise ValueError(f"familyfold needs config.data.source = 'archiveii' and no config.data.train_files "
                         f"(got source {data.get('source')!r}, train_files {data.get('train_files', '')!r}): "
                         f"the held-out folds are ArchiveII families")


def _copy(config):
    import ml_collections

    return ml_collections.ConfigDict(config.to_dict())


def family_config(config, family: str, *, test_lengths, max_eval_length: int = 0,
                  max_batch_cells: int = DEFAULT_MAX_BATCH_CELLS, num_devices: int = 1, cross_check: bool = False):
    """The training config of ``family``'s fold (a copy of ``config``).

    ``data.fold = family``; ``data.max_eval_length`` = ``max_eval_length``, or
    with 0 the longest of ``test_lengths`` (the family's sequences after the
    data filter: full length); ``data.eval_buckets`` extended by
    :func:`extra_buckets`; ``eval_batch_size`` lowered where its largest
    evaluation batch would exceed ``max_batch_cells`` chart cells.
    Training fields (``data.max_length``, ``data.buckets``, the optimizer, ...)
    are untouched. ``eval_test`` = ``cross_check``: the training run's own
    evaluation of the held-out family, which :func:`run_family` then repeats
    beside RNAfold, is skipped unless a cross-check is asked for.
    """
    from foldax.train.compare import eval_batch_sizes

    cfg = _copy(config)
    lengths = [int(n) for n in test_lengths]
    cap = int(max_eval_length) or max(lengths)
    buckets = tuple(int(b) for b in (cfg.data.get("eval_buckets", None) or cfg.data.buckets))
    buckets = buckets + extra_buckets(buckets, [n for n in lengths if n <= cap])
    with cfg.ignore_type():
        cfg.data.fold = family
        cfg.data.max_eval_length = cap
        cfg.data.eval_buckets = buckets
        cfg.eval_test = bool(cross_check)
    eval_batch = int(cfg.get("eval_batch_size", cfg.batch_size))
    if max_batch_cells:
        cfg.eval_batch_size = min(eval_batch, eval_batch_sizes(buckets[-1:], eval_batch, max_batch_cells=max_batch_cells,
                                                               num_devices=num_devices)[0])
    return cfg


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _setup(config, options: dict) -> dict:
    return {"config": json.loads(config.to_json_best_effort(sort_keys=True)), "options": options}


def _check_setup(path: str, setup: dict) -> None:
    """Stops a rerun whose config or options differ from the saved ones (its families would mix)."""
    from foldax.train.checkpointing import LATER_FIELDS

    with open(path) as fh:
        saved = json.load(fh)
    old = {**_flat(saved["config"]), **_flat(saved["options"], "option ")}
    new = {**_flat(setup["config"]), **_flat(setup["options"], "option ")}
    old, new = ({k: c.get(k, LATER_FIELDS.get(k)) for k in old.keys() | new.keys()} for c in (old, new))
    differ = sorted(k for k in old if k not in VOLATILE_FIELDS and old[k] != new[k])
    if differ:
        detail = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ[:6])
        raise ValueError(f"{path} holds a family-fold run with another config ({detail}"
                         f"{', ...' if len(differ) > 6 else ''}): use a new --workdir, or the same config")


def _write_json(path: str, obj) -> None:
    """Atomically (a finished file or none: a result file marks a finished family)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------- one family


def _short_hairpin(example: dict, min_hairpin: int) -> bool:
    table = np.asarray(example["pair_table"])
    idx = np.arange(len(table))
    return bool(np.any((table > idx) & (table - idx <= min_hairpin)))


def left_out_counts(family_rows: list[dict], config, *, max_eval_length: int, n_evaluated: int) -> dict:
    """Why rows of the held-out family are not evaluated: ``{reason: count}`` (non-zero ones).

    Mirrors :func:`foldax.train.datasets.load_splits` on the test split: ``not_listed``
    (``data.filtered``: not in ArchiveII's family lists), ``short_hairpin``
    (``data.short_hairpins = "drop"``), ``longer_than_max_eval_length``,
    ``subset`` (``data.max_test_examples``); ``other`` would be a mismatch.
    """
    return {k: n for k, (n, _) in _left_out(family_rows, config, max_eval_length=max_eval_length,
                                             n_evaluated=n_evaluated).items()}


def _left_out(family_rows, config, *, max_eval_length: int, n_evaluated: int) -> dict:
    """``{reason: (count, longest length or None)}`` of :func:`left_out_counts` (non-zero counts)."""
    data, min_hairpin = config.data, int(config.model.get("min_hairpin", 3))
    lengths = {"not_listed": [], "short_hairpin": [], "longer_than_max_eval_length": []}
    kept = 0
    for ex in family_rows:
        if data.get("filtered", True) and not ex["in_lis"]:
            lengths["not_listed"].append(ex["length"])
        elif max_eval_length and ex["length"] > max_eval_length:
            lengths["longer_than_max_eval_length"].append(ex["length"])
        elif data.get("short_hairpins", "drop") == "drop" and _short_hairpin(ex, min_hairpin):
            lengths["short_hairpin"].append(ex["length"])
        else:
            kept += 1
    out = {k: (len(v), max(v, default=None)) for k, v in lengths.items()}
    limit = int(data.get("max_test_examples", 0))
    subset = kept - min(kept, limit) if limit else 0
    out["subset"] = (subset, None)
    out["other"] = (kept - subset - n_evaluated, None)
    return {k: v for k, v in out.items() if v[0]}


def _leakage_checks(splits: dict, family: str) -> dict:
    """The held-out family is absent from train and validation (else a RuntimeError), and which
    test sequences (if any) also occur there (counted; ArchiveII has none across families)."""
    seen = {s: sum(ex["family"] == family for ex in splits[s]) for s in ("train", "valid")}
    if any(seen.values()):
        raise RuntimeError(f"held-out family {family!r} found in training data ({seen}): the fold split is broken")
    if any(ex["family"] != family for ex in splits["test"]):
        raise RuntimeError(f"the test split of fold {family!r} holds other families")
    known = {ex["sequence"] for s in ("train", "valid") for ex in splits[s]}
    shared = sum(ex["sequence"] in known for ex in splits["test"])
    if shared:
        log.warning("fold %s: %d test sequences also occur in the training families", family, shared)
    return {"held_out_in_train": 0, "held_out_in_valid": 0, "test_sequences_in_train_or_valid": shared,
            "valid_families": sorted({ex["family"] for ex in splits["valid"]})}


def _load_summary(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        summary = json.load(fh)
    return summary if summary.get("status") == "finished" else None


def run_family(config, workdir: str, family: str, *, family_rows: list[dict], max_eval_length: int = 0,
               rnafold: bool = True, max_batch_cells: int = DEFAULT_MAX_BATCH_CELLS,
               cross_check: bool = False) -> dict | None:
    """Trains (or resumes) and evaluates one fold; returns its record, or None after a SIGTERM stop.

    ``cross_check``: the training run evaluates the held-out family too, and the record's
    ``checks["summary_test_mea_f1"]`` holds its MEA F1, to equal this evaluation's (a check of the
    chain that doubles the evaluation time).

    A finished family (``<workdir>/<family>/familyfold_family.json``) is read, not redone.
    """
    import jax

    from foldax.train import train as trainer
    from foldax.train.compare import compare
    from foldax.train.datasets import load_splits

    fdir = os.path.join(workdir, family)
    result_path = os.path.join(fdir, RESULT_NAME)
    if os.path.exists(result_path):
        with open(result_path) as fh:
            return json.load(fh)
    t_start = time.time()
    min_hairpin = int(config.model.get("min_hairpin", 3))
    if not family_rows:
        raise ValueError(f"family {family!r} has no rows in the data; leave it out with --families")
    probe = _copy(config)  # the family's test rows after the data filter, any length, all of them
    with probe.ignore_type():
        probe.data.fold, probe.data.max_eval_length, probe.data.max_test_examples = family, 10**9, 0
    test_lengths = [ex["length"] for ex in load_splits(probe.data, min_hairpin=min_hairpin, seed=int(config.seed),
                                                      splits=("test",))["test"]]
    fcfg = family_config(config, family, test_lengths=test_lengths, max_eval_length=max_eval_length,
                         max_batch_cells=max_batch_cells, num_devices=jax.device_count(), cross_check=cross_check)
    splits = load_splits(fcfg.data, min_hairpin=min_hairpin, seed=int(fcfg.seed))  # as train_and_evaluate does
    checks = _leakage_checks(splits, family)

    summary = _load_summary(os.path.join(fdir, "summary.json"))
    if summary is None:
        _say(f"familyfold: {family} held out -- training in {fdir} "
             f"(train {len(splits['train'])}, valid {len(splits['valid'])}, test {len(splits['test'])})")
        summary = trainer.train_and_evaluate(fcfg, fdir)
        if summary["status"] != "finished":
            return None
    _say(f"familyfold: {family} held out -- evaluating step {summary.get('best_step')} on "
         f"{len(splits['test'])} sequences")
    t_eval = time.time()
    result = compare(fdir, split="test", which="best", config=fcfg, rnafold=rnafold,
                     rnafold_cache=os.path.join(workdir, "rnafold_cache.jsonl") if rnafold else None,
                     max_batch_cells=max_batch_cells)
    left_out = _left_out(family_rows, config, max_eval_length=max_eval_length, n_evaluated=result["n_seqs"])
    if "test/mea/f1" in summary:
        checks["summary_test_mea_f1"] = summary["test/mea/f1"]  # the run's own test evaluation, same data
    record = {
        "family": family, "name": FAMILY_NAMES.get(family, family), "workdir": fdir,
        "n_train": len(splits["train"]), "n_valid": len(splits["valid"]), "n_test": len(splits["test"]),
        "n_seqs": result["n_seqs"], "n_family_rows": len(family_rows),
        "min_length": min(s["length"] for s in result["sequences"]), "max_length": result["max_length"],
        "max_eval_length": int(fcfg.data.max_eval_length), "eval_buckets": list(fcfg.data.eval_buckets),
        "eval_batch_size": int(fcfg.eval_batch_size),
        "left_out": {k: n for k, (n, _) in left_out.items()},
        "left_out_longest": {k: longest for k, (_, longest) in left_out.items() if longest},
        "training": {k: summary.get(k) for k in ("steps", "best_step", "resumed_from_step", "train_wall_s",
                                                 "wall_time_s", "train_steps_per_s", "valid/mea/f1", "valid/best/f1")
                     if k in summary},
        "checks": checks, "step": result["step"], "methods": result["methods"],
        "rnafold": result["rnafold"], "rnafold_status": result["rnafold_status"],
        "rnafold_cache": result["rnafold_cache"], "eval_wall_s": time.time() - t_eval,
        "family_wall_s": time.time() - t_start, "sequences": result["sequences"],
    }
    _write_json(result_path, record)
    return record


# --------------------------------------------------------------------- all families


def _say(message: str) -> None:
    print(message, flush=True)


def aggregate(records: dict) -> dict:
    """Means over families (each family weighs the same) and pooled over sequences, per method.

    ``records``: ``{family: record}`` of :func:`run_family`. A method is in the
    means only if every family has it.
    """
    fams = list(records.values())
    methods = [m for m in METHODS if fams and all(m in r["methods"] for r in fams)]
    mean, pooled = {}, {}
    n = np.array([r["n_seqs"] for r in fams], float)
    for m in methods:
        keys = [k for k in fams[0]["methods"][m] if k not in ("label", "n_seqs")]
        values = {k: np.array([r["methods"][m][k] for r in fams]) for k in keys}
        mean[m] = {"label": fams[0]["methods"][m]["label"], "n_families": len(fams), "n_seqs": int(n.sum()),
                   **{k: float(v.mean()) for k, v in values.items()}}
        pooled[m] = {"label": fams[0]["methods"][m]["label"], "n_seqs": int(n.sum()),
                     **{k: float((v * n).sum() / n.sum()) for k, v in values.items()}}
    return {"mean": mean, "pooled": pooled}


def familyfold(config, workdir: str, *, families=None, max_eval_length: int = 0, rnafold: bool = True,
               max_batch_cells: int = DEFAULT_MAX_BATCH_CELLS, config_name: str = "",
               cross_check: bool = False) -> dict:
    """Runs (or resumes) the family folds; writes and returns ``familyfold.json``'s content.

    ``families``: family codes (default all of :data:`foldax.data.archiveii.FAMILIES`),
    run in that order; the outputs cover every finished family of ``workdir``.
    ``cross_check``: see :func:`run_family`.
    """
    from foldax.data.archiveii import FAMILIES, load_archiveii
    from foldax.layers.compiled import release_compiled_programs
    from foldax.train import train as trainer

    check_config(config)
    families = list(families or FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; ArchiveII has {list(FAMILIES)}")
    if max_eval_length < 0 or max_batch_cells < 0:
        raise ValueError("max_eval_length and max_batch_cells must be >= 0")
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    setup = _setup(config, {"max_eval_length": int(max_eval_length), "max_batch_cells": int(max_batch_cells)})
    setup_path = os.path.join(workdir, "familyfold_config.json")
    if os.path.exists(setup_path):
        _check_setup(setup_path, setup)
        with open(setup_path) as fh:
            config_name = json.load(fh).get("config_name", "") or config_name
    else:
        _write_json(setup_path, {**setup, "config_name": config_name})
    trainer.setup_jax(config)
    rows = load_archiveii(config.data.get("path", "") or None)
    status = "finished"
    for k, family in enumerate(families, start=1):
        _say(f"familyfold: family {k}/{len(families)}: {family} ({FAMILY_NAMES[family]})")
        record = run_family(config, workdir, family, family_rows=[r for r in rows if r["family"] == family],
                            max_eval_length=max_eval_length, rnafold=rnafold, max_batch_cells=max_batch_cells,
                            cross_check=cross_check)
        if record is None:
            status = "preempted"
            _say(f"familyfold: stopped during {family} (SIGTERM); run the same command again to resume")
            break
        result = write_outputs(workdir, config, setup["options"], config_name=config_name)
        _say(format_family_line(record))
        # JAX keeps every compiled program, each in memory mappings of its own; ten families' programs
        # in one process can approach Linux's per-process limit (vm.max_map_count), where XLA crashes.
        release_compiled_programs()
    result = write_outputs(workdir, config, setup["options"], config_name=config_name)
    result["status"] = status
    return result


def _records(workdir: str) -> dict:
    from foldax.data.archiveii import FAMILIES

    out = {}
    for family in FAMILIES:
        path = os.path.join(workdir, family, RESULT_NAME)
        if os.path.exists(path):
            with open(path) as fh:
                out[family] = json.load(fh)
    return out


def write_outputs(workdir: str, config, options: dict, *, config_name: str = "") -> dict:
    """``familyfold.json`` and ``familyfold.md`` from every finished family of ``workdir``."""
    from foldax.data.archiveii import FAMILIES

    records = _records(workdir)
    result = {
        "workdir": workdir, "config_name": config_name, "model": config.model.get("name", "stacking"),
        "config": json.loads(config.to_json_best_effort(sort_keys=True)), "options": options,
        "complete": len(records) == len(FAMILIES),
        "families_missing": [f for f in FAMILIES if f not in records],
        **aggregate(records), "families": records,
    }
    _write_json(os.path.join(workdir, "familyfold.json"), result)
    with open(os.path.join(workdir, "familyfold.md"), "w") as fh:
        fh.write(format_markdown(result) + "\n")
    return result


# ----------------------------------------------------------------------- reporting


def format_family_line(record: dict) -> str:
    parts = [f"{record['methods'][m]['label']} {record['methods'][m]['f1']:.3f}" for m in METHODS
             if m in record["methods"]]
    return (f"familyfold: {record['family']}: {record['n_seqs']} sequences (<= {record['max_length']} nt), F1: "
            + ", ".join(parts))


def _fmt(x) -> str:
    return f"{x:.3f}"


def _left_out_text(record: dict) -> str:
    words = {"not_listed": "not in ArchiveII's family lists", "short_hairpin": "with a hairpin < min_hairpin",
             "longer_than_max_eval_length": f"longer than {record['max_eval_length']} nt",
             "subset": "outside the data.max_test_examples subset", "other": "unexplained (a bug)"}
    longest = record.get("left_out_longest", {})
    return "; ".join(f"{n} {words[k]}" + (f" (up to {longest[k]:,} nt)" if k in longest else "")
                     for k, n in record["left_out"].items()) or "none"


def format_markdown(result: dict) -> str:
    """The tables of ``familyfold.md`` (see the module docstring)."""
    records = result["families"]
    cfg = result["config"]
    data = cfg["data"]
    methods = [m for m in METHODS if m in result["mean"]]
    lines = [f"# Family-fold cross-validation on ArchiveII: foldax ({result['model']}) vs RNAfold", ""]
    source = result["config_name"] or "the config in familyfold_config.json"
    if data.get("valid_families"):
        validation = (f"the rows of a family set aside for validation, neither trained on nor held out "
                      f"(`data.valid_families = {data['valid_families']!r}`)")
    else:
        validation = "the validation rows of the training families only"
    lines.append(f"Config {source}; workdir `{result['workdir']}`. One model per held-out family, trained on the "
                 f"other families; best checkpoint by `{cfg.get('best_metric', 'mea/f1')}` on {validation}. "
                 f"Scores: per-sequence means against the nested reference pairs.")
    lines.append("")
    if records:
        longest = max(records.values(), key=lambda r: r["max_length"])
        cap = result["options"]["max_eval_length"]
        policy = (f"every sequence of the held-out family at full length (longest here: {longest['max_length']} nt, "
                  f"{longest['name']})" if not cap else f"held-out sequences up to {cap} nt (longer ones left out, "
                  f"counted below)")
        filters = []
        if data.get("filtered", True):
            filters.append("in ArchiveII's family lists (the full-length 16S/23S rRNAs are not: their domains are)")
        if data.get("short_hairpins", "drop") == "drop":
            filters.append(f"no hairpin shorter than {cfg['model'].get('min_hairpin', 3)} nt")
        lines.append(f"Evaluation: {policy}; rows kept by the data filter: {'; '.join(filters) or 'all'}. "
                     f"Training and validation: rows of at most {data.get('max_length')} nt "
                     f"(`data.max_length`).")
        lines.append("")
    if result["families_missing"]:
        lines.append(f"**Incomplete:** {len(records)} of {len(records) + len(result['families_missing'])} families "
                     f"done; missing: {', '.join(result['families_missing'])}.")
        lines.append("")
    if not records:
        return "\n".join(lines)

    labels = {m: result["mean"][m]["label"] for m in methods}
    head = "| held-out family | seqs | nt | " + " | ".join(labels[m] for m in methods)
    has_rnafold = "rnafold" in methods
    lines += ["## F1 (mean per sequence)", "",
              head + (" | MEA - RNAfold |" if has_rnafold else " |"),
              "|---|---:|---:|" + "---:|" * (len(methods) + has_rnafold)]
    for r in records.values():
        f1 = {m: r["methods"][m]["f1"] for m in methods}
        row = f"| {r['name']} | {r['n_seqs']} | {r['min_length']}-{r['max_length']} | " + \
            " | ".join(_fmt(f1[m]) for m in methods)
        lines.append(row + (f" | {f1['mea'] - f1['rnafold']:+.3f} |" if has_rnafold else " |"))
    mean = result["mean"]
    row = f"| **mean of {len(records)} families** | {mean[methods[0]]['n_seqs']} | | " + \
        " | ".join(f"**{_fmt(mean[m]['f1'])}**" for m in methods)
    lines.append(row + (f" | **{mean['mea']['f1'] - mean['rnafold']['f1']:+.3f}** |" if has_rnafold else " |"))
    pooled = result["pooled"]
    row = "| all sequences (pooled) | | | " + " | ".join(_fmt(pooled[m]["f1"]) for m in methods)
    lines.append(row + (f" | {pooled['mea']['f1'] - pooled['rnafold']['f1']:+.3f} |" if has_rnafold else " |"))
    lines.append("")

    lines += ["## All metrics", "", "| held-out family | method | " + " | ".join(h for _, h in TABLE_METRICS) + " |",
              "|---|---|" + "---:|" * len(TABLE_METRICS)]
    for name, per in [(r["name"], r["methods"]) for r in records.values()] + \
            [(f"**mean of {len(records)} families**", mean)]:
        for k, m in enumerate(methods):
            lines.append(f"| {name if k == 0 else ''} | {labels[m]} | "
                         + " | ".join(_fmt(per[m][key]) for key, _ in TABLE_METRICS) + " |")
    lines.append("")
    lines.append("F1 +-1: a pair shifted by one position counts as correct. MCC over all i < j candidate pairs.")
    lines.append("")

    lines += ["## Runs and what was left out", "",
              "| held-out family | train | valid | best step | train min | eval min | test rows left out |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for r in records.values():
        t = r["training"]
        train_min = f"{t['wall_time_s'] / 60:.1f}" if t.get("wall_time_s") is not None else "-"
        lines.append(f"| {r['name']} | {r['n_train']} | {r['n_valid']} | {t.get('best_step', '-')} | {train_min} | "
                     f"{r['eval_wall_s'] / 60:.1f} | {r['n_family_rows'] - r['n_seqs']} of {r['n_family_rows']}: "
                     f"{_left_out_text(r)} |")
    if not has_rnafold:
        status = next(iter(records.values()))["rnafold_status"]
        lines += ["", f"RNAfold: {status} (pip install viennarna; or --no-rnafold was given)."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foldax familyfold", description=__doc__.split("\n\n")[0],
        epilog="Any config field can be overridden as in foldax train: --config.a.b=value "
               "(e.g. --config.optimizer.l2=0.0); a resume checks them against familyfold_config.json.")
    parser.add_argument("--config", help="config file (configs/*.py[:arg]); default: the workdir's "
                                         "familyfold_config.json")
    parser.add_argument("--workdir", required=True, help="output folder (one training workdir per family inside)")
    parser.add_argument("--families", default="", help="comma-separated family codes (default: all ten, "
                                                        "5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s,grp2)")
    parser.add_argument("--max-eval-length", type=int, default=0, metavar="N",
                        help="leave out held-out sequences longer than N nt (default 0: full length, all)")
    parser.add_argument("--max-batch-cells", type=int, default=DEFAULT_MAX_BATCH_CELLS, metavar="C",
                        help=f"at most C chart cells (rows x length^2) per evaluation batch "
                             f"(default {DEFAULT_MAX_BATCH_CELLS})")
    parser.add_argument("--no-rnafold", dest="rnafold", action="store_false", help="skip RNAfold")
    parser.add_argument("--cross-check", action="store_true",
                        help="each training run evaluates its held-out family too, which must equal familyfold's "
                             "own evaluation (checks.summary_test_mea_f1; doubles the evaluation time)")
    return parser


def _load_config(args, overrides):
    import ml_collections

    from foldax.train.main import apply_overrides, load_config_file

    if args.config:
        config = load_config_file(args.config)
    else:
        path = os.path.join(args.workdir, "familyfold_config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: give --config (e.g. configs/default.py)")
        with open(path) as fh:
            config = ml_collections.ConfigDict(json.load(fh)["config"])
    return apply_overrides(config, overrides)


def main(argv: list[str] | None = None) -> int:
    """``python -m foldax.train.familyfold ...`` / ``foldax familyfold ...``; returns the exit status."""
    from foldax.train.main import _setup_logging, _split_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rest, overrides = _split_overrides(argv)
    except ValueError as err:
        print(f"foldax familyfold: error: {err}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(rest)
    except SystemExit as err:
        return 0 if err.code in (0, None) else 2
    _setup_logging()
    from foldax.train.train import TrainingDiverged

    try:
        config = _load_config(args, overrides)
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        config_name = (args.config or "") + "".join(f" --config.{k}={v}" for k, v in overrides)
        result = familyfold(config, args.workdir, families=families, max_eval_length=args.max_eval_length,
                            rnafold=args.rnafold, max_batch_cells=args.max_batch_cells, config_name=config_name,
                            cross_check=args.cross_check)
    except TrainingDiverged as err:
        print(f"foldax familyfold: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"foldax familyfold: error: {err}", file=sys.stderr)
        return 1
    print(format_markdown(result))
    print(f"wrote {os.path.join(result['workdir'], 'familyfold.json')} and familyfold.md"
          + ("" if result["status"] == "finished" else " (stopped early: rerun to resume)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
