"""Turner 2004 with an MEA ``gamma`` chosen on the training families: family-fold, next to RNAfold (issue 12).

No training: the parameters stay Turner 2004 (``turner2004``); the one choice is the MEA decoder's
``gamma`` (:func:`foldax.layers.mea_structure`: a pair counts ``2 gamma P_ij``, an unpaired base
``q_i``). For each held-out ArchiveII family, ``gamma`` is the value of ``--gammas`` with the best
mean-over-families F1 on the *other* families, never on the held-out one; the held-out family is then
scored at that ``gamma``. With ``--energy-scales`` the choice is of a pair (scale, ``gamma``): the
pair probabilities of every Turner 2004 energy multiplied by the scale (the ensemble at temperature
``kT / scale``: above 1 sharper, below 1 flatter; the MFE structure is the same at every scale), chosen
on the other families in the same way. Beside it: the Turner 2004 best structure (the MFE, RNAfold's structure up to
energy ties) and RNAfold on the same sequences.

With ``--mixture turner1999`` the MEA decoders at scale 1 read the mean of Turner 2004's and
Turner 1999's pair probabilities (:func:`foldax.layers.mixture_pair_probs`; ``foldax fold --params
turner2004+turner1999 --mea``), computed by foldax itself.

The sequences are what ``foldax familyfold`` evaluates for a family (``configs/turner.py``'s data
filter, its ``test`` split at ``data.fold = family``, up to ``--max-length`` nt). Pair probabilities
are computed once per sequence (``layers.pair_probs``, float32, batches by length bucket split over
the cores); every ``gamma`` decodes from them. Writes ``--out`` (JSON: per family and ``gamma`` the mean
F1, and the family-fold table) after each family, and resumes from it; prints the table. Run::

    .venv/bin/python benchmarks/familyfold_gamma.py --out /tmp/gamma.json \\
        --rnafold-cache runs/ff/rnafold_cache.jsonl [--energy-scales 0.8,1,1.25]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAMMAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: Rows of one batch: at most this many chart cells (rows x bucket^2).
MAX_BATCH_CELLS = 1 << 20


def family_examples(family: str, max_length: int) -> list[dict]:
    """The family's sequences as ``foldax familyfold`` evaluates them (its ``test`` split)."""
    from foldax.configs import turner
    from foldax.train.datasets import load_splits

    config = turner.get_config()
    with config.ignore_type():
        config.data.fold, config.data.max_eval_length, config.data.max_test_examples = family, max_length, 0
        config.data.valid_families = ""
    try:
        return load_splits(config.data, min_hairpin=3, seed=int(config.seed), splits=("test",))["test"]
    except ValueError as err:
        if "split is empty" in str(err):  # every sequence of the family is longer than max_length
            return []
        raise


def best_on_others(candidates, family_f1, families, held_out: str, tie=lambda candidate: 0):
    """The candidate with the best mean over the families other than ``held_out`` of
    ``family_f1(family, candidate)``; among equal means, the largest ``tie(candidate)``. The family-fold
    rule of every benchmarks/familyfold_*.py choice: the held-out family never takes part."""
    others = [f for f in families if f != held_out]
    return max(candidates, key=lambda c: (round(sum(family_f1(f, c) for f in others) / len(others), 12), tie(c)))


def decoder_key(scale: float, gamma: float) -> str:
    """The per-family score's key of MEA at ``gamma`` on the energies times ``scale`` (scale 1: just
    the gamma, as files written before --energy-scales have it)."""
    return str(gamma) if scale == 1.0 else f"{scale:g}x{gamma}"


def choose(scores: dict, held_out: str, gammas, scales=(1.0,)) -> tuple[float, float]:
    """The (scale, gamma) with the best mean over the families other than ``held_out`` of their mean
    F1 (ties: the scale nearer 1, then the gamma nearer 1)."""
    measured = [f for f in scores if scores[f]["n_seqs"]]
    pairs = [(s, g) for s in scales for g in gammas]
    return best_on_others(pairs, lambda f, p: scores[f][decoder_key(*p)], measured, held_out,
                          tie=lambda p: (-abs(p[0] - 1.0), -abs(p[1] - 1.0)))


def table_f1(pred, truth) -> float:
    """F1 of exact base pairs between two pair tables (``-1``: unpaired), as
    :func:`foldax.model.metrics.pair_metrics` counts it (1 when both have no pair)."""
    import numpy as np

    pred, truth = np.asarray(pred), np.asarray(truth)
    idx = np.arange(len(truth))
    n_pred, n_true = int(np.sum(pred > idx)), int(np.sum(truth > idx))
    tp = int(np.sum((pred > idx) & (pred == truth)))
    precision = tp / n_pred if n_pred else 1.0
    recall = tp / n_true if n_true else 1.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    parser.add_argument("--energy-scales", default="1", help="comma-separated factors of every energy (the "
                        "ensemble at kT / scale); each is one more pair-probability pass per sequence")
    parser.add_argument("--mixture", default="", help="comma-separated shipped parameter sets (e.g. turner1999) "
                        "whose pair probabilities are averaged with Turner 2004's (layers.mixture_pair_probs, "
                        "uniform) for the MEA decoders at scale 1: foldax fold --params turner2004+NAME --mea")
    parser.add_argument("--families", default="", help="comma-separated codes (default: all ten)")
    parser.add_argument("--rnafold-cache", default="", help="a foldax RNAfold cache file (JSON lines)")
    parser.add_argument("--dump", default="", help="a folder: per family, an .npz of every sequence's length, "
                        "reference and predicted pair tables and pair probabilities >= 1e-4 (to try decoders offline; "
                        "a family already in --out is not measured, so not dumped, again)")
    args = parser.parse_args(argv)

    from foldax import layers

    layers.use_all_cores()
    import jax
    import numpy as np

    from foldax.data.archiveii import FAMILIES
    from foldax.model.metrics import pair_metrics
    from foldax.train.compare import RnafoldCache, _load_rnafold, _rnafold_tables, eval_batch_sizes

    gammas = [float(g) for g in args.gammas.split(",")]
    scales = [float(s) for s in args.energy_scales.split(",")]
    if any(s <= 0 for s in scales):
        parser.error(f"--energy-scales must be positive, got {args.energy_scales}")
    families = [f for f in args.families.split(",") if f] or list(FAMILIES)
    if len(families) < 2:
        parser.error("--families needs at least two families: gamma is chosen on the ones not held out")
    params = layers.load_params("turner2004")
    scaled = {s: jax.tree.map(lambda e, s=s: e * s, params) for s in scales}
    mixed = [layers.load_params(name) for name in args.mixture.split(",") if name]
    RNA = _load_rnafold()
    cache = RnafoldCache(args.rnafold_cache or None, RNA) if RNA is not None else None
    buckets = tuple(b for b in (*layers.DEFAULT_BUCKETS, args.max_length) if b <= args.max_length)
    score = jax.jit(pair_metrics)
    per_family: dict = {}
    if Path(args.out).exists():  # resume: families already measured (same gammas and length)
        done = json.loads(Path(args.out).read_text())
        if ((done["gammas"], done["max_length"], done.get("scales", [1.0]), done.get("mixture", ""))
                == (gammas, args.max_length, scales, args.mixture)):
            per_family = {f: v for f, v in done["per_family"].items() if f in families}
    for family in families:
        if family in per_family:
            continue
        t0 = time.time()
        examples = family_examples(family, args.max_length)
        if not examples:
            per_family[family] = {"n_seqs": 0}
            print(f"# {family}: no sequence of at most {args.max_length} nt: left out", flush=True)
            continue
        f1 = {name: [] for name in ["mfe", "rnafold", *(decoder_key(s, g) for s in scales for g in gammas)]}
        by_bucket: dict = {}
        dumped: dict = {"length": [], "truth": [], "mfe": [], "rnafold": [], "prob_row": [], "prob_i": [],
                        "prob_j": [], "prob": []}
        for ex in examples:
            bucket = next(b for b in buckets if b >= len(ex["sequence"]))
            by_bucket.setdefault(bucket, []).append(ex)
        for bucket, members in sorted(by_bucket.items()):
            rows = eval_batch_sizes((bucket,), len(members), max_batch_cells=MAX_BATCH_CELLS,
                                    num_devices=jax.device_count())[0]
            for start in range(0, len(members), rows):
                chunk = members[start:start + rows]
                n = len(chunk)
                chunk = chunk + [chunk[-1]] * (-n % jax.device_count())  # whole batches per device
                tokens, lengths = layers.encode_batch([ex["sequence"] for ex in chunk], buckets=(bucket,))
                truth = -np.ones(tokens.shape, np.int32)
                for row, ex in enumerate(chunk):
                    truth[row, : len(ex["sequence"])] = ex["pair_table"]
                preds = {"mfe": layers.best_structure(params, tokens, lengths)}
                for s in scales:
                    if s == 1.0 and mixed:
                        scaled_probs = layers.mixture_pair_probs([params, *mixed], tokens, lengths)
                    else:
                        scaled_probs = layers.pair_probs(scaled[s], tokens, lengths)
                    if s == scales[0]:
                        probs = scaled_probs  # what --dump keeps
                    for g in gammas:
                        preds[decoder_key(s, g)] = layers.mea_structure(scaled_probs, lengths, gamma=g)
                if RNA is not None:
                    preds["rnafold"] = _rnafold_tables(RNA, [ex["sequence"] for ex in chunk], bucket, cache)
                for name, pred in preds.items():
                    f1[name].extend(np.asarray(score(np.asarray(pred), truth, lengths)["f1"])[:n].tolist())
                if args.dump:
                    probs = np.asarray(probs)
                    for row, ex in enumerate(chunk[:n]):
                        i, j = np.nonzero(np.triu(probs[row]) >= 1e-4)
                        dumped["prob_row"].append(np.full(i.shape, len(dumped["length"]), np.int32))
                        dumped["prob_i"].append(i.astype(np.int16))
                        dumped["prob_j"].append(j.astype(np.int16))
                        dumped["prob"].append(probs[row, i, j].astype(np.float32))
                        size = len(ex["sequence"])
                        dumped["length"].append(size)
                        dumped["truth"].append(truth[row, :size])
                        dumped["mfe"].append(np.asarray(preds["mfe"])[row, :size])
                        if "rnafold" in preds:
                            dumped["rnafold"].append(np.asarray(preds["rnafold"])[row, :size])
            # Each Turner program holds thousands of memory mappings while JAX keeps it; all buckets'
            # programs in one process exceed Linux's 65,530 (XLA: "Unable to allocate section memory").
            layers.release_compiled_programs()
        per_family[family] = {"n_seqs": len(examples), **{k: float(np.mean(v)) for k, v in f1.items() if v}}
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            flat = {k: np.concatenate(dumped[k]) for k in ("prob_row", "prob_i", "prob_j", "prob")}
            for k in ("truth", "mfe", "rnafold"):  # pair tables, concatenated in order of "length"
                flat[k] = np.concatenate(dumped[k]) if dumped[k] else np.zeros(0, np.int32)
            np.savez_compressed(Path(args.dump) / f"{family}.npz", length=np.asarray(dumped["length"]), **flat,
                                **{f"f1_{k}": np.asarray(v) for k, v in f1.items() if v})
        Path(args.out).write_text(json.dumps({"gammas": gammas, "max_length": args.max_length, "scales": scales,
                                              "mixture": args.mixture, "per_family": per_family}, indent=1))
        print(f"# {family}: {len(examples)} sequences, {time.time() - t0:.0f} s: "
              + ", ".join(f"{k} {v:.3f}" for k, v in per_family[family].items() if k != "n_seqs"), flush=True)

    measured = [f for f in families if per_family[f]["n_seqs"]]
    if len(measured) < 2:
        print(f"# only {len(measured)} family has sequences of at most {args.max_length} nt: no family-fold table")
        return 0
    table = {}
    for family in measured:
        s, g = choose(per_family, family, gammas, scales)
        table[family] = {"scale": s, "gamma": g, "mea": per_family[family][decoder_key(s, g)],
                         "mfe": per_family[family]["mfe"],
                         "rnafold": per_family[family].get("rnafold")}
    means = {k: float(np.mean([row[k] for row in table.values()])) for k in ("mea", "mfe", "rnafold")
             if all(row[k] is not None for row in table.values())}
    lines = ["| held-out family | n | energy scale, gamma (chosen on the other families) | Turner 2004 MEA | "
             "Turner 2004 MFE | RNAfold |", "|---|---:|---:|---:|---:|---:|"]
    for family, row in table.items():
        lines.append(f"| {family} | {per_family[family]['n_seqs']} | {row['scale']:g}, {row['gamma']:g} | {row['mea']:.3f} | "
                     f"{row['mfe']:.3f} | {row['rnafold'] if row['rnafold'] is None else format(row['rnafold'], '.3f')} |")
    lines.append(f"| **mean of {len(table)}** | | | **{means.get('mea', float('nan')):.3f}** | "
                 f"{means.get('mfe', float('nan')):.3f} | {means.get('rnafold', float('nan')):.3f} |")
    left_out = [f for f in families if not per_family[f]["n_seqs"]]
    if left_out:
        lines.append(f"\nLeft out (no sequence of at most {args.max_length} nt): {', '.join(left_out)}")
    print("\n".join(lines))
    Path(args.out).write_text(json.dumps({"gammas": gammas, "max_length": args.max_length, "scales": scales,
                                          "per_family": per_family, "table": table, "means": means}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
