"""Does coaxial stacking of helices help across families? ViennaRNA's MFE with and without it (issue 12).

ViennaRNA models coaxial stacking only in its minimum free energy (``dangles = 3``: ``dangles = 1``'s
single dangles plus a stacking bonus for adjacent helices in multiloops and the exterior loop); its
partition function treats ``dangles = 3`` (and 1) as ``dangles = 2``, so there is no ensemble, MEA or pair
probability to compare. ``d1`` (single dangles, no coaxial stacking) separates the two changes. This screen compares the MFE structures of the two energy models (Turner 2004
either way) on the sequences ``foldax familyfold`` evaluates, and applies the family-fold rule: for each
held-out family, the model with the better mean over the *other* families (:func:`best_on_others`).

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


def mfe_f1(task) -> list[float]:
    """F1 of ViennaRNA's MFE structure (Turner 2004, ``dangles``) for each ``(sequence, pair table)``
    of a chunk: ``task = (dangles, chunk)``.

      >>> chunk = [("GGGGAAACCCC", [10, 9, 8, -1, -1, -1, -1, -1, 2, 1, 0])]  # MFE ((((...)))): 3 of 4 pairs right
      >>> [round(f, 3) for f in mfe_f1((2, chunk))], [round(f, 3) for f in mfe_f1((3, chunk))]
      ([0.857], [0.857])
    """
    import RNA

    from foldax.layers.dotbracket import from_dot_bracket

    dangles, chunk = task
    md = RNA.md()
    md.dangles = dangles
    return [table_f1(from_dot_bracket(RNA.fold_compound(seq, md).mfe()[0]), true) for seq, true in chunk]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="resumable JSON of per-family mean F1")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-per-family", type=int, default=0, help="a seeded sample per family (0: all)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]

    setup = {"max_length": args.max_length, "max_per_family": args.max_per_family}
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if done.get("setup") != setup:
        done = {"setup": setup, "per_family": {}}
    per_family = done["per_family"]
    with multiprocessing.Pool(args.processes) as pool:
        for family in families:
            if set(per_family.get(family, {})) >= set(MODELS):
                continue
            examples = subset(family_examples(family, args.max_length), args.max_per_family)
            items = sorted(((ex["sequence"], ex["pair_table"]) for ex in examples), key=lambda it: -len(it[0]))
            chunks = [items[k:k + 8] for k in range(0, len(items), 8)]
            row = {"n_seqs": len(items)}
            t0 = time.time()
            for name, dangles in MODELS.items():
                f1 = [f for part in pool.map(mfe_f1, [(dangles, c) for c in chunks]) for f in part]
                row[name] = sum(f1) / len(f1)
            per_family[family] = row
            Path(args.out).write_text(json.dumps(done, indent=1))
            print(f"# {family}: {len(items)} seqs, {time.time() - t0:.0f} s", flush=True)

    families = [f for f in families if f in per_family]
    print("| held-out family | seqs | " + " | ".join(f"MFE {m}" for m in MODELS) + " | chosen on the others | F1 |")
    print("|---|---:|" + "---:|" * len(MODELS) + "---|---:|")
    chosen_f1 = []
    for family in families:
        row = per_family[family]
        pick = best_on_others(list(MODELS), lambda f, m: per_family[f][m], families, family)
        chosen_f1.append(row[pick])
        print(f"| {family} | {row['n_seqs']} | " + " | ".join(f"{row[m]:.3f}" for m in MODELS)
              + f" | {pick} | {row[pick]:.3f} |")
    means = [sum(per_family[f][m] for f in families) / len(families) for m in MODELS]
    print("| **mean** | | " + " | ".join(f"{v:.3f}" for v in means)
          + f" | | **{sum(chosen_f1) / len(chosen_f1):.3f}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
