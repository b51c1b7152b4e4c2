"""Sampling and best-structure speed: the traceback against the outside pass, and ViennaRNA.

``sample_structures`` and ``best_structure`` read structures off the charts in one of two ways
(``layers.decoding.METHODS``): a top-down traceback that steps only through the cells of each
structure (the default) or a full outside pass per structure. Each (case, method) runs in a
process of its own, the methods alternating, and reports the best of ``--repeats`` calls after
the compiling one. ViennaRNA (one thread, ``md.uniq_ML = 1``) times ``fc.pf()`` plus
``fc.pbacktrack(samples)`` (sampling cases) or ``fc.mfe()`` (best-structure cases) on the same
sequences::

    python benchmarks/bench_sampling.py                  # every case, both methods
    python benchmarks/bench_sampling.py --methods traceback --rounds 2
    python benchmarks/bench_sampling.py --methods traceback --cases 0,1,2   # CASES[0], [1], [2]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

#: (what, grammar, length, samples, dtype, sequences): random ACGU sequences.
CASES = [("sample", "turner", 20, 1000, "float32", 2), ("sample", "turner", 100, 200, "float32", 2),
         ("sample", "turner", 300, 1000, "float32", 1),
         ("sample", "stacking", 100, 1000, "float32", 2), ("sample", "stacking", 12, 2000, "float64", 2),
         ("best", "turner", 500, 1, "float32", 1), ("best", "turner", 200, 1, "float32", 8)]


def sequences(length: int, count: int) -> list[str]:
    rng = random.Random(length)
    return ["".join(rng.choice("ACGU") for _ in range(length)) for _ in range(count)]


def run_one(what, grammar, length, samples, dtype, count, method, repeats) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from foldax import layers

    tokens, lengths = layers.encode_batch(sequences(length, count), buckets=None)
    params = layers.turner2004(jnp.dtype(dtype)) if grammar == "turner" else jax.tree.map(
        lambda x: jnp.asarray(x, dtype), layers.default_params())

    def call(k):
        if what == "best":
            return layers.best_structure(params, tokens, lengths, method=method)
        return layers.sample_structures(jax.random.key(k), params, tokens, samples, lengths, method=method)

    start = time.perf_counter()
    np.asarray(call(0))
    first = time.perf_counter() - start
    runs = []
    for k in range(repeats):
        start = time.perf_counter()
        np.asarray(call(k + 1))
        runs.append(time.perf_counter() - start)
    return {"first_s": first, "run_s": min(runs)}


def vienna(what, length, samples, count, repeats) -> float | None:
    try:
        import RNA
    except ImportError:
        return None
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for seq in sequences(length, count):
            md = RNA.md()
            md.uniq_ML = 1
            fc = RNA.fold_compound(seq, md)
            if what == "best":
                fc.mfe()
            else:
                fc.pf()
                fc.pbacktrack(samples)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["traceback", "outside"])
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of every method")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    parser.add_argument("--one", nargs=7, help=argparse.SUPPRESS)  # a worker: a case and a method
    args = parser.parse_args(argv)
    if args.one:
        what, grammar, length, samples, dtype, count, method = args.one
        print(json.dumps(run_one(what, grammar, int(length), int(samples), dtype, int(count), method, args.repeats)))
        return
    print(f"{'what':6} {'grammar':9} {'n':>4} {'seqs':>4} {'samples':>7} {'dtype':8} {'method':10} {'first s':>8} "
          f"{'run s':>8} {'ms/sample':>9} {'vs ' + args.methods[-1]:>13} {'vs ViennaRNA':>12}")
    for case in [CASES[int(k)] for k in args.cases.split(",")] if args.cases else CASES:
        what, grammar, length, samples, dtype, count = case
        best = {}
        for _ in range(args.rounds):
            for method in args.methods:
                out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--one", *map(str, case),
                                      method], capture_output=True, text=True, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                if method not in best or result["run_s"] < best[method]["run_s"]:
                    best[method] = result
        rna = vienna(what, length, samples, count, args.repeats) if grammar == "turner" else None
        for method in args.methods:
            r = best[method]
            speedup = best[args.methods[-1]]["run_s"] / r["run_s"]
            against = f"{r['run_s'] / rna:>11.1f}x" if rna else f"{'':>12}"
            print(f"{what:6} {grammar:9} {length:>4} {count:>4} {samples:>7} {dtype:8} {method:10} {r['first_s']:>8.1f} "
                  f"{r['run_s']:>8.3f} {1000 * r['run_s'] / samples:>9.2f} {speedup:>12.2f}x {against}", flush=True)
        if rna:
            print(f"{what:6} {grammar:9} {length:>4} {count:>4} {samples:>7} {'float64':8} {'ViennaRNA':10} {'':>8} "
                  f"{rna:>8.3f} {1000 * rna / samples:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
