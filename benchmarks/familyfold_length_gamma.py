"""Other decoders of Turner 2004's pair probabilities, chosen on the training families: family-fold (issue 12).

Reads the per-sequence F1 scores that ``benchmarks/familyfold_gamma.py --dump DIR`` writes (one
``.npz`` per family: every sequence's length and its F1 at each ``gamma`` of the grid) and asks
whether letting ``gamma`` depend on the sequence's length beats the one fixed ``gamma``.

A rule is a length threshold ``T`` and two grid values: ``gamma_short`` for sequences shorter than
``T``, ``gamma_long`` for the others (``T = 0``: one fixed gamma). For each held-out family the rule
with the best mean-over-families F1 on the *other* families is chosen (ties: the fixed rule, then
gammas nearer 1); the held-out family is then scored with it. No decoding is repeated: each
sequence's F1 at each grid ``gamma`` is already in the dump.

Beside it, ThreshKnot (:func:`threshknot`; it may pair across, as ArchiveII's references do) with its
threshold chosen the same way from the dumped pair probabilities. Run::

    .venv/bin/python benchmarks/familyfold_length_gamma.py --dump /work/bench/dump
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, table_f1  # noqa: E402  (a sibling benchmark)

THRESHOLDS = (0, 100, 150, 200, 250, 300, 400)
#: ThreshKnot's probability thresholds (its paper's default is 0.3).
KNOT_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def load(dump: str) -> dict:
    """``{family: {"length": [n], "f1": {gamma: [n]}, "rnafold": [n]}}`` of the families in ``dump``."""
    families = {}
    for path in sorted(Path(dump).glob("*.npz")):
        with np.load(path) as data:
            f1 = {float(k[3:]): data[k] for k in data.files if k.startswith("f1_") and k[3:4].isdigit()}
            families[path.stem] = {"length": data["length"], "f1": f1, "rnafold": data["f1_rnafold"],
                                   "mfe": data["f1_mfe"], "mfe_table": data["mfe"], **{k: data[k] for k in ("truth", "prob_row", "prob_i",
                                                                                  "prob_j", "prob")}}
    return families


def sequences(family: dict):
    """Per sequence: its reference pair table, MFE pair table and sparse pair probabilities ``i, j, p``."""
    starts = np.concatenate([[0], np.cumsum(family["length"])])
    by_row = np.searchsorted(family["prob_row"], np.arange(len(family["length"]) + 1))
    for row in range(len(family["length"])):
        lo, hi = by_row[row], by_row[row + 1]
        yield (family["truth"][starts[row]:starts[row + 1]], family["mfe_table"][starts[row]:starts[row + 1]],
               family["prob_i"][lo:hi].astype(int), family["prob_j"][lo:hi].astype(int), family["prob"][lo:hi])


def threshknot(size: int, i, j, p, threshold: float) -> np.ndarray:
    """ThreshKnot (Zhang et al. 2019): pair (i, j) when its probability is at least ``threshold`` and
    the largest of every pair probability of i and of j. Pseudoknots are allowed, as in ArchiveII's
    references; of equal probabilities the first pair wins."""
    best = np.zeros(size, np.float32)
    np.maximum.at(best, i, p)
    np.maximum.at(best, j, p)
    table = -np.ones(size, np.int64)
    for k in np.flatnonzero((p == best[i]) & (p == best[j]) & (p >= threshold)):
        if table[i[k]] < 0 and table[j[k]] < 0:
            table[i[k]], table[j[k]] = j[k], i[k]
    return table


def threshknot_f1(family: dict, thresholds) -> dict:
    """``{threshold: per-sequence F1}`` of :func:`threshknot`."""
    out = {t: [] for t in thresholds}
    for truth, _, i, j, p in sequences(family):
        for t in thresholds:
            out[t].append(table_f1(threshknot(len(truth), i, j, p, t), truth))
    return {t: np.asarray(v) for t, v in out.items()}


def rule_f1(family: dict, threshold: int, short: float, long: float) -> float:
    """A family's mean F1 when sequences shorter than ``threshold`` use ``short``, the others ``long``."""
    is_short = family["length"] < threshold
    return float(np.mean(np.where(is_short, family["f1"][short], family["f1"][long])))


def rules(gammas):
    """Every rule: ``(threshold, gamma_short, gamma_long)``; the fixed ones have threshold 0."""
    yield from ((0, g, g) for g in gammas)
    yield from ((t, s, l) for t in THRESHOLDS[1:] for s, l in itertools.product(gammas, gammas) if s != l)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", required=True, help="the folder familyfold_gamma.py --dump wrote")
    args = parser.parse_args(argv)
    families = load(args.dump)
    if len(families) < 2:
        parser.error(f"{args.dump}: needs the dumps of at least two families")
    gammas = sorted(next(iter(families.values()))["f1"])
    lines = ["| held-out family | seqs | rule (chosen on the other families) | length-dependent MEA | "
             "fixed-gamma MEA | ThreshKnot (threshold chosen on the other families) | RNAfold |",
             "|---|---:|---|---:|---:|---:|---:|"]
    rows = []
    knots = {name: {t: float(np.mean(v)) for t, v in threshknot_f1(family, KNOT_THRESHOLDS).items()}
             for name, family in families.items()}
    for name, family in families.items():
        # ties: the fixed rule, then gammas nearer 1; ThreshKnot's threshold nearer its paper's 0.3
        threshold, short, long = best_on_others(
            rules(gammas), lambda f, r: rule_f1(families[f], *r), families, name,
            tie=lambda r: (r[0] == 0, -abs(np.log(r[1])) - abs(np.log(r[2]))))
        fixed = best_on_others([(0, g, g) for g in gammas], lambda f, r: rule_f1(families[f], *r), families, name,
                               tie=lambda r: -abs(np.log(r[1])))
        knot = best_on_others(KNOT_THRESHOLDS, lambda f, t: knots[f][t], families, name, tie=lambda t: -abs(t - 0.3))
        row = (rule_f1(family, threshold, short, long), rule_f1(family, *fixed), knots[name][knot],
               float(np.mean(family["rnafold"])))
        rows.append(row)
        text = f"gamma {short:g}" if threshold == 0 else f"{short:g} below {threshold} nt, else {long:g}"
        lines.append(f"| {name} | {len(family['length'])} | {text} | {row[0]:.3f} | {row[1]:.3f} (gamma "
                     f"{fixed[1]:g}) | {row[2]:.3f} ({knot:g}) | {row[3]:.3f} |")
    means = np.mean(rows, axis=0)
    lines.append(f"| **mean of {len(rows)}** | | | **{means[0]:.3f}** | {means[1]:.3f} | {means[2]:.3f} | "
                 f"{means[3]:.3f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
