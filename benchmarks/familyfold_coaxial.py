"""Does coaxial stacking of helices help across families? ViennaRNA's MFE with and without it (issue 12).

ViennaRNA models coaxial stacking only in its minimum free energy (``dangles = 3``: ``dangles = 1``'s
single dangles plus a stacking bonus for adjacent helices in multiloops and the exterior loop); its
partition function treats ``dangles = 3`` (and 1) as ``dangles = 2``, so there is no ensemble, MEA or
pair probability to compare. This screen compares the MFE structures of ``dangles`` 2, 1 and 3 (Turner
2004 energies; d1 against d3 isolates the coaxial term) on the sequences ``foldax familyfold``
evaluates, and applies the family-fold rule: for each held-out family, the model with the best mean
over the *other* families (:func:`best_on_others`).

A second table gates per sequence, with nothing fitted to the held-out family: d3's MFE structure where
coaxial stacking lowers the MFE by more than a threshold (kcal/mol per 100 nt, chosen on the other
families), else the MEA structure at gamma 0.5 of the ``dangles = 2`` ensemble (``foldax fold --mea``).

The question it answers is whether a junction model richer than ViennaRNA's default (the direction
left open by the global-term screens in BENCHMARKS.md) is worth building as a foldax grammar::

    .venv/bin/python benchmarks/familyfold_coaxial.py --out runs/coaxial.json

``--max-per-family 60`` runs the seeded sample of ``familyfold_terms.py`` instead of every sequence.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, family_examples, table_f1  # noqa: E402  (sibling benchmarks)
from familyfold_terms import subset  # noqa: E402

FAMILIES = ("tRNA", "5s", "srp", "RNaseP", "tmRNA", "grp1", "16s", "telomerase", "23s")
MODELS = {"d2": 2, "d1": 1, "d3_coaxial": 3}  # name -> ViennaRNA's md.dangles (d1 isolates the coaxial term)
#: Gate thresholds in kcal/mol per 100 nt (``inf``: always MEA, i.e. Turner 2004 as ``foldax fold --mea``).
GATE_THRESHOLDS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)


def fold_chunk(chunk) -> list[dict]:
    """Per ``(sequence, reference pair table)`` of ``chunk``: the F1 of ViennaRNA's MFE
    structure under each of :data:`MODELS`, of the MEA structure at gamma 0.5 of the ``dangles = 2``
    ensemble (``foldax fold --mea``'s decoder, 0.594 on these families), and ``coaxial_gain``, what
    coaxial stacking lowers the MFE by, in kcal/mol per 100 nt (d1's MFE minus d3's: the same dangle model).

      >>> row, = fold_chunk([("GGGGAAACCCC", [10, 9, 8, -1, -1, -1, -1, -1, 2, 1, 0])])  # MFE ((((...))))
      >>> {k: round(v, 3) for k, v in row.items()}
      {'d2': 0.857, 'd1': 0.857, 'd3_coaxial': 0.857, 'mea0.5': 0.857, 'coaxial_gain': 0.0}
    """
    import RNA

    from familyfold_paramsets import vienna_ensemble
    from foldax.layers.dotbracket import from_dot_bracket

    RNA.params_load_RNA_Turner2004()
    out = []
    for sequence, true in chunk:
        fc, d2_structure, _ = vienna_ensemble(sequence)  # d2, RNA.md()'s default: its MFE is ready
        row, energy = {"d2": table_f1(from_dot_bracket(d2_structure), true)}, {}
        for name, dangles in MODELS.items():
            if dangles == 2:
                continue
            md = RNA.md()
            md.dangles = dangles
            structure, energy[dangles] = RNA.fold_compound(sequence, md).mfe()
            row[name] = table_f1(from_dot_bracket(structure), true)
        row["mea0.5"] = table_f1(from_dot_bracket(fc.MEA(0.5)[0]), true)
        row["coaxial_gain"] = (energy[1] - energy[3]) * 100 / len(sequence)
        out.append(row)
    return out


def gated_f1(rows, threshold: float) -> float:
    """Mean F1 of the per-sequence gate: d3's MFE structure where coaxial stacking lowers the MFE by more
    than ``threshold`` kcal/mol per 100 nt, else the MEA structure (gamma 0.5) of the d2 ensemble.

      >>> rows = [{"coaxial_gain": 3.0, "d3_coaxial": 0.9, "mea0.5": 0.5}, {"coaxial_gain": 0.5, "d3_coaxial": 0.1, "mea0.5": 0.7}]
      >>> gated_f1(rows, 1.0), gated_f1(rows, float("inf"))
      (0.8, 0.6)
    """
    return sum(r["d3_coaxial"] if r["coaxial_gain"] > threshold else r["mea0.5"] for r in rows) / len(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="resumable JSON of per-sequence rows, per family")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-per-family", type=int, default=0, help="a seeded sample per family (0: all)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]

    setup = {"max_length": args.max_length, "max_per_family": args.max_per_family, "models": MODELS}
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if done.get("setup") != setup:
        done = {"setup": setup, "per_family": {}}
    per_family = done["per_family"]
    with multiprocessing.Pool(args.processes) as pool:
        for family in families:
            if family in per_family:
                continue
            examples = subset(family_examples(family, args.max_length), args.max_per_family)
            items = sorted(((ex["sequence"], ex["pair_table"]) for ex in examples), key=lambda it: -len(it[0]))
            t0 = time.time()
            per_family[family] = [r for part in pool.map(fold_chunk, [items[k:k + 8] for k in range(0, len(items), 8)])
                                  for r in part]
            Path(args.out).write_text(json.dumps(done))
            print(f"# {family}: {len(items)} seqs, {time.time() - t0:.0f} s", flush=True)

    families = [f for f in families if f in per_family]

    def mean(family, key):
        return sum(r[key] for r in per_family[family]) / len(per_family[family])

    def summary(header, options, family_f1, label):
        print(header)
        chosen = []
        for family in families:
            pick = best_on_others(options, family_f1, families, family)
            chosen.append(family_f1(family, pick))
            print(f"| {family} | {len(per_family[family])} | " + " | ".join(f"{family_f1(family, o):.3f}" for o in options)
                  + f" | {label(pick)} | {chosen[-1]:.3f} |")
        print("| **mean** | | " + " | ".join(f"{sum(family_f1(f, o) for f in families) / len(families):.3f}" for o in options)
              + f" | | **{sum(chosen) / len(chosen):.3f}** |\n")

    models = list(MODELS)
    summary("| held-out family | seqs | " + " | ".join(f"MFE {m}" for m in models) + " | chosen on the others | F1 |\n"
            "|---|---:|" + "---:|" * len(models) + "---|---:|", models, mean, str)
    thresholds = [*GATE_THRESHOLDS, float("inf")]
    summary("| held-out family | seqs | " + " | ".join(f"gate {t:g}" for t in thresholds)
            + " | threshold chosen on the others | F1 |\n|---|---:|" + "---:|" * len(thresholds) + "---|---:|",
            thresholds, lambda f, t: gated_f1(per_family[f], t), lambda t: f"{t:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
