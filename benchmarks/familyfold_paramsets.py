"""Which published energy parameter set, and which MEA ``gamma``: family-fold on ArchiveII (issue 12).

No training. The candidates are ViennaRNA's parameter sets (Turner 2004, its default; Andronescu
2007; Langdon 2018; Turner 1999), each decoded as the MFE structure and as the MEA structure at each
of ``--gammas``, and as the MEA structure whose gamma the sequence's own ensemble picks
(``mea_pef``, :func:`pseudo_expected_f1`). For each held-out ArchiveII family the (set, decoder)
pair is the one with the best mean-over-families F1 on the *other* families, never on the held-out
one; the held-out family is then scored with it. This is a screen run on ViennaRNA itself
(``fc.mfe``, ``fc.pf``, ``fc.MEA``, whose objective -- ``2 gamma P_ij`` per pair, ``q_i`` per unpaired base -- is
:func:`foldax.layers.mea_structure`'s), because ViennaRNA computes the same ensembles as foldax
(tests/test_turner_*) in a fraction of the compile-heavy time; ``benchmarks/familyfold_gamma.py
--params`` then measures a chosen set with foldax itself.

The sequences are what ``foldax familyfold`` evaluates (:func:`familyfold_gamma.family_examples`, up to
``--max-length`` nt). F1 is per sequence on exact pairs, as :func:`foldax.model.metrics.pair_metrics`.
Writes ``--out`` (JSON, resumable per parameter set and family) and prints the table::

    .venv/bin/python benchmarks/familyfold_paramsets.py --out /tmp/paramsets.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, family_examples, table_f1  # noqa: E402  (a sibling benchmark)

SETS = {  # name -> ViennaRNA loader
    "turner2004": "params_load_RNA_Turner2004",
    "andronescu2007": "params_load_RNA_Andronescu2007",
    "langdon2018": "params_load_RNA_Langdon2018",
    "turner1999": "params_load_RNA_Turner1999",
}
GAMMAS = (0.25, 0.5, 1.0, 2.0, 4.0)


def pseudo_expected_f1(pair_table, probs, expected_pairs: float) -> float:
    """The F1 of a predicted structure expected under the ensemble, to first order (Hamada et al.
    2010, "pseudo-expected accuracy"): ``2 SUM_{(i,j) in S} P_ij / (|S| + SUM_{i<j} P_ij)``, with
    ``probs`` the symmetric pair-probability matrix. 1 for two empty structures, as :func:`table_f1`.

    Example (one pair of probability 0.5 in the ensemble):
      >>> import numpy as np
      >>> probs = np.zeros((4, 4)); probs[0, 3] = probs[3, 0] = 0.5
      >>> round(pseudo_expected_f1([3, -1, -1, 0], probs, 0.5), 3), pseudo_expected_f1([-1] * 4, probs, 0.5)
      (0.667, 0.0)
    """
    import numpy as np

    pair_table = np.asarray(pair_table)
    idx = np.arange(len(pair_table))
    paired = pair_table > idx
    if not paired.any():
        return 1.0 if expected_pairs < 1e-12 else 0.0
    return 2 * float(probs[idx[paired], pair_table[paired]].sum()) / (int(paired.sum()) + expected_pairs)


def load_energies(name_or_par: str) -> None:
    """Makes ViennaRNA's energies (in this process) a set of :data:`SETS` by name, or a ``.par`` file."""
    import RNA

    if name_or_par in SETS:
        getattr(RNA, SETS[name_or_par])()
    else:
        RNA.params_load(name_or_par)


def model_options(text: str) -> dict[str, int]:
    """``"noLP=1,dangles=0"`` -> ``{"noLP": 1, "dangles": 0}``: ``RNA.md`` settings (integers).

      >>> model_options("noLP=1,dangles=0"), model_options("")
      ({'noLP': 1, 'dangles': 0}, {})
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    bad = [item for item in items if item.count("=") != 1 or not item.split("=")[1].strip().lstrip("-").isdigit()]
    if bad:
        raise ValueError(f"model options {bad}: expected key=integer items, e.g. noLP=1,dangles=0")
    return {k.strip(): int(v) for k, v in (item.split("=") for item in items)}


def vienna_ensemble(sequence: str, options: dict[str, int] | None = None):
    """``(fold_compound, MFE structure, log Z)`` of ``sequence`` under the loaded energies, its
    partition function computed (``pf_smooth = 0`` as foldax and its tests; Boltzmann factors rescaled
    from the MFE so that long sequences do not overflow): ``fc.bpp()`` and ``fc.MEA`` are ready.
    ``options`` are further ``RNA.md`` settings (e.g. ``noLP``: no lonely pairs)."""
    import RNA

    from foldax.layers import KT

    md = RNA.md()
    md.pf_smooth = 0
    for key, value in (options or {}).items():
        setattr(md, key, value)
    fc = RNA.fold_compound(sequence, md)
    structure, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    _, ensemble_energy = fc.pf()
    return fc, structure, -ensemble_energy / KT  # 37 C, ViennaRNA's default


def ranked_lines(options, family_f1, families, label=str) -> list[str]:
    """Markdown bullets of every option by its mean over ``families`` of ``family_f1(family, option)``,
    best first, with the per-family values."""
    def mean(option):
        return sum(family_f1(f, option) for f in families) / len(families)

    return [f"- {label(o)}: {mean(o):.3f} (" + " / ".join(f"{family_f1(f, o):.3f}" for f in families) + ")"
            for o in sorted(options, key=lambda o: -mean(o))]


def fold_chunk(task):
    """F1 of every decoder for a chunk of ``(sequence, reference pair table)`` under one parameter set
    (a name of :data:`SETS` or a ``.par`` path) and ``RNA.md`` options:
    ``task = (set, options, gammas, chunk, with_pef)``.

    ``mea_pef`` (with ``with_pef``): per sequence, the MEA structure of the gamma (of ``gammas``) whose
    pseudo-expected F1 is the highest -- a decoder that chooses its own gamma from the ensemble, with
    nothing fitted."""
    import numpy as np

    from foldax.layers.dotbracket import from_dot_bracket

    name, options, gammas, chunk, with_pef = task
    load_energies(name)
    out = []
    for sequence, true in chunk:
        fc, structure, _ = vienna_ensemble(sequence, options)
        row = {"mfe": table_f1(from_dot_bracket(structure), true)}
        if with_pef:
            probs = np.array(fc.bpp())[1:, 1:]
            probs = probs + probs.T
            expected_pairs = float(np.triu(probs, 1).sum())
        best_pef = -1.0
        for g in gammas:
            table = from_dot_bracket(fc.MEA(g)[0])
            row[f"mea{g:g}"] = table_f1(table, true)
            if not with_pef:
                continue
            pef = pseudo_expected_f1(table, probs, expected_pairs)
            if pef > best_pef:  # ties: the smaller gamma (never the reference's say)
                best_pef, row["mea_pef"] = pef, row[f"mea{g:g}"]
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    parser.add_argument("--families", default="5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--model-options", default="",
                        help="RNA.md settings for every set, e.g. noLP=1 or dangles=0,noLP=1; its keys "
                             "are named set[options], so that runs with other options share one --out")
    args = parser.parse_args(argv)
    try:
        options = model_options(args.model_options)
    except ValueError as err:
        parser.error(str(err))
    sets = [s for s in args.sets.split(",") if s]
    gammas = [float(g) for g in args.gammas.split(",")]
    families = [f for f in args.families.split(",") if f]
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        parser.error(f"unknown parameter sets {unknown}; known: {', '.join(SETS)}")

    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if done.get("gammas") != gammas or done.get("max_length") != args.max_length:
        done = {"gammas": gammas, "max_length": args.max_length, "per_family": {}}
    per_family = done["per_family"]
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        for family in families:
            examples = family_examples(family, args.max_length)
            items = [(ex["sequence"], ex["pair_table"]) for ex in examples]
            # longest first, in small chunks: the two processes finish together
            items.sort(key=lambda item: -len(item[0]))
            chunks = [items[k:k + 8] for k in range(0, len(items), 8)]
            for name in sets:
                key = f"{name}[{args.model_options}]" if options else name
                if f"{key}/mea_pef" in per_family.get(family, {}):  # (older files lack it: rerun)
                    continue
                t0 = time.time()
                tasks = [(name, options, gammas, c, True) for c in chunks]
                rows = [row for part in pool.map(fold_chunk, tasks) for row in part]
                means = {f"{key}/{k}": sum(r[k] for r in rows) / len(rows) for k in rows[0]}
                per_family.setdefault(family, {"n_seqs": len(rows)}).update(means)
                Path(args.out).write_text(json.dumps(done, indent=1))
                print(f"# {family} {key}: {len(rows)} sequences, {time.time() - t0:.0f} s: "
                      + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in means.items()), flush=True)

    scores = {f: {k: v for k, v in per_family[f].items() if k != "n_seqs"} for f in families}
    lines = ["| held-out family | seqs | chosen on the others | its F1 | Turner 2004 MEA 0.5 | Turner 2004 MFE |",
             "|---|---:|---|---:|---:|---:|"]
    chosen_f1, t_mea, t_mfe = [], [], []
    for family in families:
        key = best_on_others(scores[family], lambda f, k: scores[f][k], families, family)
        row = scores[family]
        chosen_f1.append(row[key])
        t_mea.append(row.get("turner2004/mea0.5", float("nan")))  # (from a run without --model-options)
        t_mfe.append(row.get("turner2004/mfe", float("nan")))
        lines.append(f"| {family} | {per_family[family]['n_seqs']} | {key} | {row[key]:.3f} | "
                     f"{t_mea[-1]:.3f} | {t_mfe[-1]:.3f} |")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lines.append(f"| **mean of {len(families)}** | | | **{mean(chosen_f1):.3f}** | {mean(t_mea):.3f} | "
                 f"{mean(t_mfe):.3f} |")
    lines += ["", "Mean over families of each set and decoder:", ""]
    lines += ranked_lines(scores[families[0]], lambda f, k: scores[f][k], families)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
