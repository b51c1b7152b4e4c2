"""A trained run's held-out accuracy next to RNAfold's (ViennaRNA) on the same sequences.

Usage::

    python -m foldax.train.compare --workdir runs/default [--split test] [--checkpoint best|latest]
                            [--rnafold-cache FILE] [--max-batch-cells C]

Loads the run's ``config.json`` and checkpoint (as ``foldax eval`` does), the
same split the evaluation uses (:func:`foldax.train.datasets.load_splits`, the same
evaluation batches), and predicts each sequence with the model -- the MEA
structure (``config.gamma``) and the best structure (:func:`foldax.model.decoding.predict`).
If ViennaRNA's Python module ``RNA`` is installed (``pip install viennarna``),
each sequence is also folded with RNAfold (``RNA.fold``: minimum free energy,
default model -- Turner 2004 parameters at 37 C); with ``--rnafold-cache FILE``
its structures are kept per sequence in FILE (:class:`RnafoldCache`), so a rerun
folds nothing twice. Every method is scored with
the same function against the same reference pair tables
(:func:`foldax.model.metrics.pair_metrics`: F1, F1 +-1, MCC, precision, recall;
per-sequence means; for ArchiveII these are the nested references the model
trains on). Prints a table and writes
``<workdir>/compare.json`` (``compare_<split>.json`` for a split other than
``test``) with the means and the per-sequence F1.

Long sequences: ``--max-batch-cells C`` caps each evaluation batch at ``C``
chart cells (rows x bucket length^2; the DP's memory is about 120 bytes per
cell in float32), so long buckets get fewer rows than ``eval_batch_size``.
Sequences longer than the largest ``data.eval_buckets`` are left out (and counted:
``n_dropped_overlong``), as in the run's own evaluation.

:func:`main` ``(argv)`` returns the exit status: 0 done, 1 error (message on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys

import numpy as np

__all__ = ["compare", "format_table", "main", "RnafoldCache", "eval_batch_sizes"]

log = logging.getLogger("foldax.compare")

#: Columns of the printed table: (metric key, header).
COLUMNS = (("f1", "F1"), ("f1_slip", "F1 +-1"), ("mcc", "MCC"), ("precision", "precision"), ("recall", "recall"))


def _load_rnafold():
    """ViennaRNA's ``RNA`` module, or None when it is not installed."""
    try:
        import RNA
    except ImportError:
        return None
    return RNA


class RnafoldCache:
    """RNAfold's MFE structures per sequence, kept in a JSON-lines file.

    One line per folded sequence: ``{"sha256", "length", "rnafold", "structure",
    "energy"}`` (``rnafold`` = ViennaRNA's version; lines of another version are
    not used). A line is appended (and flushed) as soon as a sequence is folded,
    so a killed run keeps what it folded; a torn last line is skipped. RNAfold
    is deterministic, so a cached structure is exactly what it would fold again.
    ``path=None`` keeps the cache in memory only.

    >>> import RNA
    >>> cache = RnafoldCache(None, RNA)
    >>> cache.fold("GGGGAAACCCC"), cache.fold("gggguuuCCCC"), (cache.hits, cache.misses)
    ('((((...))))', '((((...))))', (0, 2))
    """

    def __init__(self, path: str | None, RNA):
        self.path, self.RNA = path, RNA
        self.version = str(RNA.__version__)
        self.hits = self.misses = 0
        self._structures: dict[str, str] = {}
        if path and os.path.exists(path):
            with open(path) as fh:
                for number, line in enumerate(fh, start=1):
                    try:
                        entry = json.loads(line)
                        if entry["rnafold"] == self.version and len(entry["structure"]) == entry["length"]:
                            self._structures[entry["sha256"]] = entry["structure"]
                    except (ValueError, KeyError, TypeError):
                        log.warning("%s:%d: unreadable RNAfold cache line skipped", path, number)

    def __len__(self) -> int:
        return len(self._structures)

    def fold(self, sequence: str) -> str:
        """RNAfold's MFE dot-bracket of ``sequence`` (upper-cased, T -> U), from the cache if there."""
        sequence = sequence.upper().replace("T", "U")
        key = hashlib.sha256(sequence.encode()).hexdigest()
        structure = self._structures.get(key)
        if structure is not None and len(structure) == len(sequence):
            self.hits += 1
            return structure
        self.misses += 1
        structure, energy = self.RNA.fold(sequence)
        self._structures[key] = structure
        if self.path:
            entry = {"sha256": key, "length": len(sequence), "rnafold": self.version, "structure": structure,
                     "energy": round(float(energy), 2)}
            with open(self.path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")
        return structure


def _rnafold_tables(RNA, sequences: list[str], length: int, cache: RnafoldCache | None = None) -> np.ndarray:
    """RNAfold's MFE pair tables ``[len(sequences), length]`` (-1 padded)."""
    from foldax.layers.dotbracket import from_dot_bracket

    cache = RnafoldCache(None, RNA) if cache is None else cache
    out = -np.ones((len(sequences), length), np.int32)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = from_dot_bracket(cache.fold(seq))
    return out


def eval_batch_sizes(buckets, eval_batch_size: int, *, max_batch_cells: int = 0, num_devices: int = 1) -> list[int]:
    """Global evaluation batch size per bucket: ``eval_batch_size``, or fewer rows where
    ``rows * bucket**2`` would exceed ``max_batch_cells`` (0 = no cap); always a positive
    multiple of ``num_devices``.

    >>> eval_batch_sizes((128, 512, 1024), 32, max_batch_cells=2**22, num_devices=2)
    [32, 16, 4]
    """
    sizes = []
    for bucket in buckets:
        rows = eval_batch_size
        if max_batch_cells:
            rows = min(rows, max_batch_cells // (int(bucket) ** 2))
        sizes.append(max(num_devices, rows // num_devices * num_devices))
    return sizes


def _eval_pipelines(config, examples: list[dict], *, max_batch_cells: int = 0):
    """``[(pipeline, example_index_map)]``: one evaluation pipeline per run of buckets with the same
    batch size (:func:`eval_batch_sizes`); ``example_index_map`` maps its ``example_index`` to ``examples``."""
    import dataclasses

    import jax

    from foldax.train import train as trainer
    from foldax.train.input_pipeline import InputPipeline

    global_batch = int(config.get("eval_batch_size", config.batch_size))
    trainer.check_batch_size(global_batch, "eval_batch_size")
    base = trainer._pipeline_config(config, batch_size=global_batch // jax.process_count(), train=False,
                                    seed=int(config.seed))
    if not max_batch_cells:
        return [(InputPipeline(examples, base), np.arange(len(examples)))]
    sizes = eval_batch_sizes(base.buckets, global_batch, max_batch_cells=max_batch_cells,
                             num_devices=jax.device_count())
    lengths = np.array([len(ex["sequence"]) for ex in examples])
    bucket_of = np.searchsorted(np.array(base.buckets), lengths)  # == len(buckets): overlong, left out
    out, start = [], 0
    for end in range(1, len(sizes) + 1):
        if end < len(sizes) and sizes[end] == sizes[start]:
            continue
        members = np.flatnonzero((bucket_of >= start) & (bucket_of < end))
        if len(members):
            cfg = dataclasses.replace(base, buckets=base.buckets[start:end], max_length=base.buckets[end - 1],
                                      batch_size=sizes[start] // jax.process_count())
            out.append((InputPipeline([examples[i] for i in members], cfg), members))
        start = end
    return out


def compare(workdir: str, *, split: str = "test", which: str = "best", config=None, rnafold: bool = True,
            rnafold_cache: str | None = None, max_batch_cells: int = 0) -> dict:
    """Per-sequence metrics of the run's model (``mea``, ``best``) and RNAfold on ``split``.

    ``config`` replaces the run's ``config.json`` (e.g. other ``data`` fields);
    ``rnafold_cache`` is a :class:`RnafoldCache` file; ``max_batch_cells`` caps
    the rows of long evaluation batches (:func:`eval_batch_sizes`).

    Returns a dict: ``workdir split checkpoint step fold n_seqs``, ``methods``
    (``{name: {"label", "n_seqs", <metric>: mean}}``, in table order),
    ``rnafold`` (ViennaRNA's version, or None), ``rnafold_status`` (``ok``,
    ``not installed`` or ``skipped``), ``n_examples`` (the split's size),
    ``n_dropped_overlong`` (longer than the largest evaluation bucket: not
    scored), ``max_length`` (longest sequence scored), ``rnafold_cache``
    (``{"hits", "misses"}`` or None) and
    ``sequences`` (per sequence: ``id length`` and each method's ``f1``).
    """
    import jax
    from flax import nnx

    from foldax.model.decoding import predict
    from foldax.model.metrics import METRIC_NAMES, pair_metrics
    from foldax.train import train as trainer
    from foldax.train.datasets import load_splits

    config, mesh, manager, graphdef, state, step = trainer.restore_for_inference(workdir, which, config)
    manager.close()
    # all three splits, as training loads them: load_splits seeds each split's max_*_examples subset by
    # its position in ``splits``, so loading one split alone would draw another subset
    splits = load_splits(config.data, min_hairpin=int(config.model.get("min_hairpin", 3)), seed=int(config.seed))
    examples = splits[split]
    pipes = _eval_pipelines(config, examples, max_batch_cells=max_batch_cells)
    gamma = float(config.get("gamma", 1.0))
    RNA = _load_rnafold() if rnafold else None
    cache = RnafoldCache(rnafold_cache, RNA) if RNA is not None else None

    decoders = ("mea", "best")
    labels = {"mea": f"foldax MEA (gamma {gamma:g})", "best": "foldax best structure"}
    if RNA is not None:
        labels["rnafold"] = f"RNAfold {RNA.__version__} (37 C)"

    def predict_step(state, tokens, lengths):
        model = nnx.merge(graphdef, state)
        if isinstance(model, tuple):  # (model, optimizer) of a training state
            model = model[0]
        return {d: predict(model, tokens, lengths, decoder=d, gamma=gamma) for d in decoders}

    predict_step = jax.jit(predict_step)
    score = jax.jit(pair_metrics)
    per_seq = {name: {m: np.full(len(examples), np.nan) for m in METRIC_NAMES} for name in labels}
    with jax.set_mesh(mesh):
        for pipe, index_map in pipes:
            for batch in pipe:
                trainer.NEW_SHAPES(id(predict_step), batch["tokens"].shape)
                rows = np.flatnonzero(np.asarray(batch["weights"]) > 0)
                index = index_map[np.asarray(batch["example_index"])[rows]]
                glob = trainer.to_global_batch(batch, mesh)
                preds = jax.device_get(predict_step(state, glob["tokens"], glob["lengths"]))
                if RNA is not None:
                    preds["rnafold"] = -np.ones_like(np.asarray(batch["pair_table"]))
                    preds["rnafold"][rows] = _rnafold_tables(RNA, [examples[i]["sequence"] for i in index],
                                                             batch["pair_table"].shape[1], cache)
                for name, pred in preds.items():
                    metrics = jax.device_get(score(np.asarray(pred), batch["pair_table"], batch["lengths"]))
                    for m in METRIC_NAMES:
                        per_seq[name][m][index] = np.asarray(metrics[m])[rows]
    done = ~np.isnan(per_seq["mea"]["f1"])  # examples the pipeline fed (all, unless it dropped overlong ones)
    if not done.all():
        longest = max(_eval_buckets(config))
        if not done.any():
            raise ValueError(f"no {split} sequence fits the largest evaluation bucket ({longest} nt): "
                             f"raise config.data.eval_buckets")
        log.warning("%s: %d sequences longer than the largest evaluation bucket (%d nt) left out",
                    split, int((~done).sum()), longest)
    methods = {}
    for name, label in labels.items():
        methods[name] = {"label": label, "n_seqs": int(done.sum()),
                         **{m: float(np.mean(per_seq[name][m][done])) for m in METRIC_NAMES}}
    sequences = [{"id": ex.get("id", str(i)), "length": int(len(ex["sequence"])),
                  "f1": {name: round(float(per_seq[name]["f1"][i]), 4) for name in labels}}
                 for i, ex in enumerate(examples) if done[i]]
    return {"workdir": os.path.abspath(workdir), "split": split, "checkpoint": which, "step": int(step),
            "fold": config.data.get("fold", "") if config.data.get("source", "") == "archiveii"
            and not config.data.get("train_files", "") else "",
            "n_seqs": int(done.sum()), "methods": methods,
            "rnafold": None if RNA is None else str(RNA.__version__),
            "rnafold_status": "ok" if RNA is not None else ("not installed" if rnafold else "skipped"),
            "n_examples": len(examples), "n_dropped_overlong": int((~done).sum()),
            "max_length": max(int(len(ex["sequence"])) for i, ex in enumerate(examples) if done[i]),
            "rnafold_cache": None if cache is None else {"hits": cache.hits, "misses": cache.misses},
            "sequences": sequences}


def _eval_buckets(config) -> tuple[int, ...]:
    """The evaluation buckets of a config (``data.eval_buckets``, else ``data.buckets``)."""
    return tuple(int(b) for b in (config.data.get("eval_buckets", None) or config.data.buckets))


def format_table(result: dict) -> str:
    """The printed report of :func:`compare`'s result."""
    held_out = f" (held-out family {result['fold']})" if result["fold"] and result["split"] == "test" else ""
    lines = [f"{result['split']} split{held_out} of {result['workdir']}, {result['checkpoint']} checkpoint "
             f"(step {result['step']}): {result['n_seqs']} sequences"]
    width = max(len("method"), *(len(m["label"]) for m in result["methods"].values()))
    lines.append(f"{'method':<{width}}  {'seqs':>5}" + "".join(f"  {h:>9}" for _, h in COLUMNS))
    for m in result["methods"].values():
        lines.append(f"{m['label']:<{width}}  {m['n_seqs']:>5}" + "".join(f"  {m[k]:>9.3f}" for k, _ in COLUMNS))
    if result["rnafold_status"] == "not installed":
        lines.append("RNAfold: ViennaRNA is not installed (pip install viennarna) -- no comparison")
    elif result["rnafold"] is None:
        lines.append("RNAfold: skipped (--no-rnafold)")
    else:
        ours = np.array([s["f1"]["mea"] for s in result["sequences"]])
        theirs = np.array([s["f1"]["rnafold"] for s in result["sequences"]])
        lines.append(f"per sequence, F1 of foldax MEA vs RNAfold: higher on {int(np.sum(ours > theirs))}, "
                     f"lower on {int(np.sum(ours < theirs))}, equal on {int(np.sum(ours == theirs))}")
    lines.append("(F1 per sequence, averaged; +-1: a pair shifted by one position counts as correct)")
    return "\n".join(lines)


def output_path(workdir: str, split: str) -> str:
    return os.path.join(workdir, "compare.json" if split == "test" else f"compare_{split}.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m foldax.train.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a training workdir (config.json and checkpoints/)")
    parser.add_argument("--split", default="test", choices=("train", "valid", "test"))
    parser.add_argument("--checkpoint", default="best", choices=("best", "latest"))
    parser.add_argument("--no-rnafold", dest="rnafold", action="store_false", help="skip RNAfold")
    parser.add_argument("--rnafold-cache", metavar="FILE", default=None,
                        help="keep RNAfold's structures per sequence in FILE (JSON lines) and reuse them")
    parser.add_argument("--max-batch-cells", type=int, default=0, metavar="C",
                        help="at most C chart cells (rows x length^2) per evaluation batch (default 0: no cap)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as err:
        return 0 if err.code in (0, None) else 2
    from foldax.train.main import _setup_logging

    _setup_logging()
    try:
        result = compare(args.workdir, split=args.split, which=args.checkpoint, rnafold=args.rnafold,
                         rnafold_cache=args.rnafold_cache, max_batch_cells=args.max_batch_cells)
    except FileNotFoundError as err:
        hint = (f" -- train a model first: foldax train --config configs/default.py --workdir {args.workdir}"
                if "checkpoint" in str(err) or "config.json" in str(err) else "")
        print(f"foldax compare: error: {err}{hint}", file=sys.stderr)
        return 1
    except (KeyError, ValueError) as err:
        print(f"foldax compare: error: {err}", file=sys.stderr)
        return 1
    print(format_table(result))
    path = output_path(args.workdir, args.split)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
