"""Turner 2004's global terms (the multiloop's and others) chosen by family-fold on ArchiveII (issue 12).

Turner 2004 scores a multiloop linearly: ``a + b * unpaired + c * branches`` (ViennaRNA's
``ML_params``: ``ml_closing`` a = 9.3, ``ml_base`` b = 0, ``ml_intern`` c = -0.9 kcal/mol). These three
numbers are the least determined by optical melting (Mathews et al. 2004; Ward et al. 2017 searched them for
prediction accuracy). Here each candidate ``(a, b, c)`` of the ``--a/--b/--c`` grid replaces them in Turner
2004 (every other table unchanged); ``--terms`` adds candidates that change other terms, ``key=value``
to set one or ``key+=delta`` to add ``delta`` to every entry of a table (``;`` joins changes). Each
(candidate, decoder) -- MFE, MEA at each of ``--gammas`` -- is scored on every family. For each
held-out family the (candidate, decoder) with the best mean-over-families F1 on the *other* families is
chosen (:func:`familyfold_gamma.best_on_others`), never on the held-out one.

A screen on ViennaRNA (``RNA.params_load`` of the candidate's ``.par``, written by
:func:`foldax.layers.save_parameter_file`), which computes the same ensembles as foldax
(tests/test_turner*). ``--max-per-family K`` screens a seeded random subset of each family (the
held-out family's own number is then re-measured on all its sequences with ``--full``). The summary
covers every candidate the ``--out`` file holds for all the families, so runs over several grids add up.

    .venv/bin/python benchmarks/familyfold_terms.py --out /tmp/ml.json --max-per-family 60
    .venv/bin/python benchmarks/familyfold_terms.py --out /tmp/ml.json --max-per-family 60 --full /tmp/ml_full.json
    .venv/bin/python benchmarks/familyfold_terms.py --out /tmp/ml.json --max-per-family 60 --a 9.3 --c=-0.9 \
        --terms "terminal_au=0.3,terminal_au=0.7,hairpin+=0.5"
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, family_examples  # noqa: E402  (sibling benchmarks)
from familyfold_paramsets import fold_chunk, ranked_lines  # noqa: E402

ML_TERMS = ("ml_closing", "ml_base", "ml_intern")  # a, b, c
TURNER = (9.3, 0.0, -0.9)  # kcal/mol
A_GRID = (6.3, 7.8, 9.3, 10.8)
B_GRID = (0.0,)
C_GRID = (-1.5, -0.9, -0.3)
GAMMAS = (0.5, 1.0)
FAMILIES = "5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s"


def candidate_name(abc) -> str:
    """``(a, b, c)`` -> ``"a9.3/b0/c-0.9"``, a multiloop candidate's key in the out file."""
    return "a{:g}/b{:g}/c{:g}".format(*abc)


TURNER_NAME = candidate_name(TURNER)


def changes(name: str) -> list[tuple[str, str, float]]:
    """A candidate's changes to Turner 2004 as ``(table, "=" or "+=", value)``.

      >>> changes(TURNER_NAME)
      [('ml_closing', '=', 9.3), ('ml_base', '=', 0.0), ('ml_intern', '=', -0.9)]
      >>> changes("terminal_au=0.3;hairpin+=-0.5")
      [('terminal_au', '=', 0.3), ('hairpin', '+=', -0.5)]
      >>> changes("hairpin-0.5")
      Traceback (most recent call last):
      ...
      ValueError: candidate 'hairpin-0.5': change 'hairpin-0.5' is not key=value or key+=delta
    """
    if re.fullmatch(r"a[-.\d]+/b[-.\d]+/c[-.\d]+", name):
        return [(key, "=", float(part[1:])) for key, part in zip(ML_TERMS, name.split("/"))]
    out = []
    for change in name.split(";"):
        match = re.fullmatch(r"(\w+)(\+?=)(.+)", change)
        try:
            out.append((match[1], match[2], float(match[3])))
        except (TypeError, ValueError):  # no match, or not a number
            raise ValueError(f"candidate {name!r}: change {change!r} is not key=value or key+=delta") from None
    return out


def candidate_params(name: str) -> dict:
    """Turner 2004 with a candidate's changes (a ``ValueError`` naming an unknown table)."""
    import numpy as np

    import foldax.layers as layers

    params = dict(layers.turner2004())
    for key, op, value in changes(name):
        if key not in params or key == "special_hairpins":
            raise ValueError(f"candidate {name!r}: no table {key!r} in Turner 2004")
        params[key] = value if op == "=" else np.asarray(params[key]) + value
    return params


def write_candidate(name: str, directory: str) -> str:
    """:func:`candidate_params` as a ViennaRNA ``.par`` file in ``directory``; returns its path."""
    import foldax.layers as layers

    path = str(Path(directory) / (re.sub(r"[^\w.=+-]", "_", name) + ".par"))
    layers.save_params(candidate_params(name), path)
    return path


def subset(examples, limit: int, seed: int = 0):
    """A seeded random subset of at most ``limit`` examples, in their order (all of them when ``limit`` is 0).

      >>> picked = subset(list("abcdef"), 3)
      >>> len(picked), picked == sorted(picked), picked == subset(list("abcdef"), 3), subset(list("abc"), 0)
      (3, True, True, ['a', 'b', 'c'])
    """
    import numpy as np

    if not limit or len(examples) <= limit:
        return list(examples)
    keep = np.sort(np.random.default_rng(seed).permutation(len(examples))[:limit])
    return [examples[k] for k in keep]


def score(out: str, candidates, gammas, families, limit: int, pool) -> dict:
    """Per family and candidate, the mean F1 of each decoder (resumable JSON at ``out``)."""
    setup = {"gammas": list(gammas), "max_per_family": limit}
    done = json.loads(Path(out).read_text()) if Path(out).exists() else {}
    if done.get("setup") != setup:
        done = {"setup": setup, "per_family": {}}
    per_family = done["per_family"]
    with tempfile.TemporaryDirectory() as tmp:
        pars = {name: write_candidate(name, tmp) for name in candidates}
        for family in families:
            examples = subset(family_examples(family, 512), limit)
            items = sorted(((ex["sequence"], ex["pair_table"]) for ex in examples), key=lambda it: -len(it[0]))
            chunks = [items[k:k + 4] for k in range(0, len(items), 4)]
            for name, par in pars.items():
                if name in per_family.get(family, {}):
                    continue
                t0 = time.time()
                rows = [r for part in pool.map(fold_chunk, [(par, {}, gammas, c, False) for c in chunks]) for r in part]
                per_family.setdefault(family, {})[name] = {
                    "n_seqs": len(rows), **{k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}}
                Path(out).write_text(json.dumps(done, indent=1))
                print(f"# {family} {name}: {len(rows)} seqs, {time.time() - t0:.0f} s, "
                      + ", ".join(f"{k} {v:.3f}" for k, v in per_family[family][name].items() if k != "n_seqs"),
                      flush=True)
    return per_family


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="screen results (JSON, resumable)")
    parser.add_argument("--full", help="re-measure each family's chosen candidate on all its sequences here")
    parser.add_argument("--max-per-family", type=int, default=0)
    parser.add_argument("--a", default=",".join(map(str, A_GRID)), help="ml_closing values")
    parser.add_argument("--b", default=",".join(map(str, B_GRID)), help="ml_base values")
    parser.add_argument("--c", default=",".join(map(str, C_GRID)), help="ml_intern values")
    parser.add_argument("--terms", default="", help="more candidates, comma-separated: key=value or key+=delta")
    parser.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    parser.add_argument("--families", default=FAMILIES)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    grid = [tuple(float(v) for v in getattr(args, k).split(",")) for k in "abc"]
    candidates = sorted({candidate_name(c) for c in itertools.product(*grid)} | {TURNER_NAME}
                        | {t for t in args.terms.split(",") if t})
    try:  # a bad --terms entry fails here, before any folding
        for name in candidates:
            candidate_params(name)
    except ValueError as err:
        parser.error(str(err))
    gammas = [float(g) for g in args.gammas.split(",")]
    families = [f for f in args.families.split(",") if f]
    decoders = ["mfe"] + [f"mea{g:g}" for g in gammas]

    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        per_family = score(args.out, candidates, gammas, families, args.max_per_family, pool)
        # Every candidate the out file holds for all the families (earlier grids too) takes part.
        screened = set.intersection(*(set(per_family[f]) for f in families))
        candidates = sorted(set(candidates) | screened)
        options = [(c, d) for c in candidates for d in decoders]
        f1 = lambda f, o: per_family[f][o[0]][o[1]]  # noqa: E731
        chosen = {f: best_on_others(options, f1, families, f,
                                    tie=lambda o: (o[0] == TURNER_NAME, o[1] == "mea0.5"))
                  for f in families}
        full = None
        if args.full:
            full = {}
            for family in families:
                picks = sorted({chosen[family][0], TURNER_NAME})
                part = score(args.full, picks, gammas, [family], 0, pool)
                full[family] = part[family]

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    source = full if full is not None else per_family
    lines = ["| held-out family | seqs | candidate, decoder chosen on the others | its F1 | Turner 2004 MEA 0.5 "
             "| Turner 2004 MFE |", "|---|---:|---|---:|---:|---:|"]
    got, base, mfe = [], [], []
    for family in families:
        name, decoder = chosen[family]
        row, turner = source[family][name], source[family][TURNER_NAME]
        got.append(row[decoder])
        base.append(turner["mea0.5"])
        mfe.append(turner["mfe"])
        lines.append(f"| {family} | {row['n_seqs']} | {name}, {decoder} | {got[-1]:.3f} | {base[-1]:.3f} "
                     f"| {mfe[-1]:.3f} |")
    lines.append(f"| **mean of {len(families)}** | | | **{mean(got):.3f}** | {mean(base):.3f} | {mean(mfe):.3f} |")
    lines += ["", f"Screen: the ten best (candidate, decoder) by their mean over families ({', '.join(families)}):", ""]
    lines += ranked_lines(options, f1, families, label=" ".join)[:10]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
