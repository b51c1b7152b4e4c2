"""A trained run's held-out accuracy next to RNAfold's (ViennaRNA) on the same sequences.

Usage::

    python -m train.compare --workdir runs/default [--split test] [--checkpoint best|latest]

Loads the run's ``config.json`` and checkpoint (as ``foldax eval`` does), the
same split the evaluation uses (:func:`train.datasets.load_splits`, the same
evaluation batches), and predicts each sequence with the model -- the MEA
structure (``config.gamma``) and the best structure (:func:`model.decoding.predict`).
If ViennaRNA's Python module ``RNA`` is installed (``pip install viennarna``),
each sequence is also folded with RNAfold (``RNA.fold``: minimum free energy,
default model -- Turner 2004 parameters at 37 C). Every method is scored with
the same function against the same reference pair tables
(:func:`model.metrics.pair_metrics`, per-sequence means; for ArchiveII these are
the nested references the model trains on). Prints a table and writes
``<workdir>/compare.json`` (``compare_<split>.json`` for a split other than
``test``) with the means and the per-sequence F1.

:func:`main` ``(argv)`` returns the exit status: 0 done, 1 error (message on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

__all__ = ["compare", "format_table", "main"]

#: Columns of the printed table: (metric key, header).
COLUMNS = (("f1", "F1"), ("f1_slip", "F1 +-1"), ("precision", "precision"), ("recall", "recall"))


def _load_rnafold():
    """ViennaRNA's ``RNA`` module, or None when it is not installed."""
    try:
        import RNA
    except ImportError:
        return None
    return RNA


def _rnafold_tables(RNA, sequences: list[str], length: int) -> np.ndarray:
    """RNAfold's MFE pair tables ``[len(sequences), length]`` (-1 padded)."""
    from layers.dotbracket import from_dot_bracket

    out = -np.ones((len(sequences), length), np.int32)
    for row, seq in enumerate(sequences):
        structure, _ = RNA.fold(seq.upper().replace("T", "U"))
        out[row, : len(seq)] = from_dot_bracket(structure)
    return out


def compare(workdir: str, *, split: str = "test", which: str = "best", config=None, rnafold: bool = True) -> dict:
    """Per-sequence metrics of the run's model (``mea``, ``best``) and RNAfold on ``split``.

    Returns a dict: ``workdir split checkpoint step fold n_seqs``, ``methods``
    (``{name: {"label", "n_seqs", <metric>: mean}}``, in table order),
    ``rnafold`` (ViennaRNA's version, or None), ``rnafold_status`` (``ok``,
    ``not installed`` or ``skipped``) and
    ``sequences`` (per sequence: ``id length`` and each method's ``f1``).
    """
    import jax
    from flax import nnx

    from model.decoding import predict
    from model.metrics import METRIC_NAMES, pair_metrics
    from train import train as trainer
    from train.datasets import load_splits

    config, mesh, manager, graphdef, state, step = trainer.restore_for_inference(workdir, which, config)
    manager.close()
    splits = load_splits(config.data, min_hairpin=int(config.model.get("min_hairpin", 3)), seed=int(config.seed),
                         splits=(split,))
    examples = splits[split]
    pipe = trainer._pipelines(config, splits, (split,))[split]
    gamma = float(config.get("gamma", 1.0))
    RNA = _load_rnafold() if rnafold else None

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
        for batch in pipe:
            rows = np.flatnonzero(np.asarray(batch["weights"]) > 0)
            index = np.asarray(batch["example_index"])[rows]
            glob = trainer.to_global_batch(batch, mesh)
            preds = jax.device_get(predict_step(state, glob["tokens"], glob["lengths"]))
            if RNA is not None:
                preds["rnafold"] = -np.ones_like(np.asarray(batch["pair_table"]))
                preds["rnafold"][rows] = _rnafold_tables(RNA, [examples[i]["sequence"] for i in index],
                                                         batch["pair_table"].shape[1])
            for name, pred in preds.items():
                metrics = jax.device_get(score(np.asarray(pred), batch["pair_table"], batch["lengths"]))
                for m in METRIC_NAMES:
                    per_seq[name][m][index] = np.asarray(metrics[m])[rows]
    done = ~np.isnan(per_seq["mea"]["f1"])  # examples the pipeline fed (all, unless it dropped overlong ones)
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
            "sequences": sequences}


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
    parser = argparse.ArgumentParser(prog="python -m train.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a training workdir (config.json and checkpoints/)")
    parser.add_argument("--split", default="test", choices=("train", "valid", "test"))
    parser.add_argument("--checkpoint", default="best", choices=("best", "latest"))
    parser.add_argument("--no-rnafold", dest="rnafold", action="store_false", help="skip RNAfold")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as err:
        return 0 if err.code in (0, None) else 2
    from train.main import _setup_logging

    _setup_logging()
    try:
        result = compare(args.workdir, split=args.split, which=args.checkpoint, rnafold=args.rnafold)
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
