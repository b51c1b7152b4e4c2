"""MEA on a mixture of several energy models' pair probabilities: family-fold screen on ArchiveII (issue 12).

No training. For each sequence ViennaRNA computes the pair probabilities ``P_k`` under each component
(a ViennaRNA parameter set by name, e.g. ``turner2004`` / ``turner1999``, or Turner 2004 with other
multiloop terms, ``ml:a,b,c`` as in ``familyfold_terms.py``). Each candidate decoder is the MEA
structure (``RNA.MEA_from_plist``, the objective of :func:`foldax.layers.mea_structure`) at one gamma of
a mixture of a subset of the components, weighted

* ``uniform``: ``mean_k P_k`` -- the families disagree on the uncertain terms, so hedge over them;
* ``evidence``: ``SUM_k w_k P_k`` with ``w_k`` proportional to ``Z_k`` (each component's partition
  function): the posterior of a model whose uncertain terms are a latent variable with a uniform prior;
* ``w<x>`` (``--weights``, pairs of components ``(0, k)`` only): ``x P_0 + (1 - x) P_k``;
* ``gate<t>`` (``--gates``, pairs of components ``(0, k)`` only): ``P_k`` where its log partition
  function exceeds component 0's by at least ``t`` nats per 100 nt, else ``P_0`` -- a per-sequence choice
  of model by how much the sequence gains from the other's energies (cheaper junctions, say).

For each held-out family the (subset, weighting, gamma) with the best mean-over-families F1 on the
*other* families is chosen (:func:`familyfold_gamma.best_on_others`), never on the held-out one.
The sequences are what ``foldax familyfold`` evaluates, up to ``--max-length`` nt (512; 3000 for all).

    .venv/bin/python benchmarks/familyfold_mixture.py --out /tmp/mix.json \
        --components turner2004,ml:10.8,0,-2.7,ml:7.8,0,-0.3 --max-per-family 60
    .venv/bin/python benchmarks/familyfold_mixture.py --out /tmp/t99.json --components turner2004,turner1999 \
        --gammas 0.25,0.5,1 --max-length 3000   # foldax fold --params turner2004+turner1999 --mea
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, family_examples, table_f1  # noqa: E402  (sibling benchmarks)
from familyfold_terms import candidate_name, subset, write_candidate  # noqa: E402
from familyfold_paramsets import SETS, load_energies, model_options, ranked_lines, vienna_ensemble  # noqa: E402

GAMMAS = (0.5, 1.0)
WEIGHTINGS = ("uniform", "evidence")
#: Pairs below this probability in the mixture are left out of the MEA's sparse list (ViennaRNA's own
#: ``fc.MEA`` uses every pair; at 1e-6 the decoded structures are the same on the checks run).
CUTOFF = 1e-6


def parse_components(text: str) -> list[str]:
    """The components of ``--components``: an ``ml:`` spec takes three comma-separated numbers, and a
    ``[...]`` suffix holds ``RNA.md`` settings (commas allowed inside).

      >>> parse_components("turner2004,ml:10.8,0,-2.7,turner1999")
      ['turner2004', 'ml:10.8,0,-2.7', 'turner1999']
      >>> parse_components("turner2004[noLP=1],turner1999[dangles=0,noLP=1],turner2004")
      ['turner2004[noLP=1]', 'turner1999[dangles=0,noLP=1]', 'turner2004']
      >>> parse_components("turner2004,ml:10.8,0")
      Traceback (most recent call last):
      ...
      ValueError: component 'ml:10.8,0' needs three numbers (ml:a,b,c)
      >>> parse_components("turner2004[noLP=1")
      Traceback (most recent call last):
      ...
      ValueError: component 'turner2004[noLP=1' has no closing ']'
    """
    parts, out = text.split(","), []
    while parts:
        head = parts.pop(0)
        if head.startswith("ml:"):
            spec = ",".join([head] + parts[:2])
            del parts[:2]
            try:
                if len(spec[3:].split(",")) != 3:
                    raise ValueError
                [float(v) for v in spec[3:].split(",")]
            except ValueError:
                raise ValueError(f"component {spec!r} needs three numbers (ml:a,b,c)") from None
            out.append(spec)
        elif "[" in head:
            while not head.endswith("]") and parts:
                head += "," + parts.pop(0)
            if not head.endswith("]"):
                raise ValueError(f"component {head!r} has no closing ']'")
            out.append(head)
        elif head:
            out.append(head)
    return out


def split_options(component: str) -> tuple[str, dict[str, int]]:
    """``"turner2004[noLP=1]"`` -> ``("turner2004", {"noLP": 1})``: the set and its ``RNA.md`` settings.

      >>> split_options("turner1999"), split_options("ml:9.3,0,-0.9[noLP=1]")
      (('turner1999', {}), ('ml:9.3,0,-0.9', {'noLP': 1}))
    """
    if "[" not in component:
        return component, {}
    name, _, options = component.partition("[")
    return name, model_options(options[:-1])


def key(subset_: tuple[int, ...], weighting: str, gamma: float) -> str:
    return f"{'+'.join(map(str, subset_))}/{weighting}/mea{gamma:g}"


def _ensembles(component, sequences):
    """Per sequence, (log Z, upper-triangular pair probabilities) under one component: ``(set, options)``,
    a set's name or a ``.par`` path (loaded once) and its ``RNA.md`` settings."""
    import numpy as np

    name, options = component
    load_energies(name)
    out = []
    for sequence in sequences:
        fc, _, log_z = vienna_ensemble(sequence, options)
        out.append((log_z, np.triu(np.array(fc.bpp())[1:, 1:], 1)))
    return out


def _fold_chunk(task):
    """Per sequence of a chunk, the F1 of every (subset, weighting, gamma) decoder."""
    import numpy as np
    import RNA

    from foldax.layers.dotbracket import from_dot_bracket

    components, subsets, gammas, gates, weights, chunk = task
    by_component = [_ensembles(c, [sequence for sequence, _ in chunk]) for c in components]
    out = []
    for n, (sequence, true) in enumerate(chunk):
        ens = [per_sequence[n] for per_sequence in by_component]
        row = {}
        for sub in subsets:
            log_z = np.array([ens[k][0] for k in sub])
            weightings = WEIGHTINGS if len(sub) > 1 else ("uniform",)
            if len(sub) == 2 and sub[0] == 0:
                weightings += tuple(f"gate{t:g}" for t in gates) + tuple(f"w{x:g}" for x in weights)
            for weighting in weightings:
                if weighting == "uniform":
                    w = np.full(len(sub), 1 / len(sub))
                elif weighting == "evidence":
                    w = np.exp(log_z - log_z.max())
                elif weighting.startswith("w"):  # w<x>: x on component 0
                    w = np.array([float(weighting[1:]), 1 - float(weighting[1:])])
                else:  # gate<t>: the second component where it gains t nats per 100 nt or more
                    gain = (log_z[1] - log_z[0]) * 100 / len(sequence)
                    w = np.array([0.0, 1.0]) if gain >= float(weighting[4:]) else np.array([1.0, 0.0])
                w = w / w.sum()
                mix = sum(wk * ens[k][1] for wk, k in zip(w, sub))
                i, j = np.nonzero(mix >= CUTOFF)
                plist = [RNA.ep(int(a) + 1, int(b) + 1, float(mix[a, b]), RNA.PLIST_TYPE_BASEPAIR)
                         for a, b in zip(i, j)]
                for g in gammas:
                    structure = RNA.MEA_from_plist(plist, sequence, g)[0]
                    row[key(sub, weighting, g)] = table_f1(from_dot_bracket(structure), true)
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--components", default="turner2004,turner1999",
                        help="comma-separated: ViennaRNA set names or ml:a,b,c (Turner 2004, other multiloop terms), "
                             "each with optional RNA.md settings, e.g. turner2004[noLP=1]")
    parser.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    parser.add_argument("--gates", default="", help="thresholds t of the gate<t> weighting (nats per 100 nt)")
    parser.add_argument("--weights", default="", help="fixed weights x of component 0 in pairs (0, k): w<x>")
    parser.add_argument("--max-per-family", type=int, default=0, help="a seeded random subset (0: all)")
    parser.add_argument("--families", default="5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=512, help="longest sequence evaluated (3000: all)")
    args = parser.parse_args(argv)
    try:
        components = parse_components(args.components)
        split = [split_options(c) for c in components]
    except ValueError as err:
        parser.error(str(err))
    for name, _ in split:
        if not name.startswith("ml:") and name not in SETS:
            parser.error(f"unknown component {name!r}; known: {', '.join(SETS)} or ml:a,b,c, each with an "
                         "optional [RNA.md settings] suffix")
    gammas = [float(g) for g in args.gammas.split(",")]
    families = [f for f in args.families.split(",") if f]
    subsets = [s for r in range(1, len(components) + 1) for s in itertools.combinations(range(len(components)), r)]
    gates = [float(t) for t in args.gates.split(",") if t]
    weights = [float(x) for x in args.weights.split(",") if x]
    if any(not 0 < x < 1 for x in weights):
        parser.error(f"--weights must lie strictly between 0 and 1, got {args.weights}")
    setup = {"components": components, "gammas": gammas, "max_per_family": args.max_per_family}
    if args.max_length != 512:  # (files written before --max-length have no such key)
        setup["max_length"] = args.max_length
    if gates:  # (files written before --gates have no such key)
        setup["gates"] = gates
    if weights:  # (nor --weights)
        setup["weights"] = weights

    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if done.get("setup") != setup:
        done = {"setup": setup, "per_family": {}}
    per_family = done["per_family"]
    with tempfile.TemporaryDirectory() as tmp, multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        paths = [(write_candidate(candidate_name(float(v) for v in name[3:].split(",")), tmp)
                  if name.startswith("ml:") else name, options) for name, options in split]
        for family in families:
            if family in per_family:
                continue
            examples = subset(family_examples(family, args.max_length), args.max_per_family)
            items = sorted(((ex["sequence"], ex["pair_table"]) for ex in examples), key=lambda it: -len(it[0]))
            chunks = [items[k:k + 4] for k in range(0, len(items), 4)]
            t0 = time.time()
            tasks = [(paths, subsets, gammas, gates, weights, c) for c in chunks]
            rows = [r for part in pool.map(_fold_chunk, tasks) for r in part]
            per_family[family] = {"n_seqs": len(rows), **{k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}}
            Path(args.out).write_text(json.dumps(done, indent=1))
            print(f"# {family}: {len(rows)} sequences, {time.time() - t0:.0f} s", flush=True)

    options = [k for k in per_family[families[0]] if k != "n_seqs"]
    base = key((0,), "uniform", 0.5)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lines = [f"Components: {', '.join(f'{k} = {c}' for k, c in enumerate(components))}", "",
             "| held-out family | seqs | chosen on the others | its F1 | component 0 MEA 0.5 |",
             "|---|---:|---|---:|---:|"]
    chosen, own = [], []
    for family in families:
        pick = best_on_others(options, lambda f, o: per_family[f][o], families, family, tie=lambda o: o == base)
        row = per_family[family]
        chosen.append(row[pick])
        own.append(row[base])
        lines.append(f"| {family} | {row['n_seqs']} | {pick} | {chosen[-1]:.3f} | {own[-1]:.3f} |")
    lines.append(f"| **mean of {len(families)}** | | | **{mean(chosen):.3f}** | {mean(own):.3f} |")
    lines += ["", f"Mean over families of each decoder ({', '.join(families)}):", ""]
    lines += ranked_lines(options, lambda f, o: per_family[f][o], families)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
