"""Sampling speed against the group size of :func:`foldax.layers.chart.sample_pairs`.

``sample_structures`` runs one outside pass per group of samples over the charts tiled ``group``
times; ``chart.SAMPLE_GROUP_ELEMENTS`` caps the tiled inputs, charts and adjoints of a group.
Each (case, cap) runs in a process of its own (the cap is read when the program is traced), the
caps alternating, and reports the best of ``--repeats`` calls after the compiling one::

    python benchmarks/bench_sampling.py                      # the cases below, caps 2^26 and 2^19
    python benchmarks/bench_sampling.py --caps 26 21 19 17 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

#: (grammar, length, samples, dtype): two random sequences each.
CASES = [("turner", 20, 1000, "float32"), ("turner", 100, 200, "float32"),
         ("stacking", 100, 1000, "float32"), ("stacking", 12, 2000, "float64")]


def run_one(grammar: str, length: int, samples: int, dtype: str, cap_log2: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from foldax import layers
    from foldax.layers import chart

    chart.SAMPLE_GROUP_ELEMENTS = 1 << cap_log2
    rng = random.Random(length)
    seqs = ["".join(rng.choice("ACGU") for _ in range(length)) for _ in range(2)]
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    params = layers.turner2004(jnp.dtype(dtype)) if grammar == "turner" else jax.tree.map(
        lambda x: jnp.asarray(x, dtype), layers.default_params())
    start = time.perf_counter()
    np.asarray(layers.sample_structures(jax.random.key(0), params, tokens, samples, lengths))
    first = time.perf_counter() - start
    runs = []
    for k in range(repeats):
        start = time.perf_counter()
        np.asarray(layers.sample_structures(jax.random.key(k + 1), params, tokens, samples, lengths))
        runs.append(time.perf_counter() - start)
    return {"first_s": first, "run_s": min(runs)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caps", type=int, nargs="+", default=[26, 19], help="log2 of SAMPLE_GROUP_ELEMENTS")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of every cap")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # grammar length samples dtype cap (a worker)
    args = parser.parse_args(argv)
    if args.one:
        grammar, length, samples, dtype, cap = args.one
        print(json.dumps(run_one(grammar, int(length), int(samples), dtype, int(cap), args.repeats)))
        return
    print(f"{'grammar':9} {'n':>4} {'samples':>7} {'dtype':8} {'cap':>5} {'first s':>8} {'run s':>8} "
          f"{'ms/sample':>9} {'vs 2^' + str(args.caps[0]):>9}")
    for case in CASES:
        best = {}
        for _ in range(args.rounds):
            for cap in args.caps:
                out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--one", *map(str, case),
                                      str(cap)], capture_output=True, text=True, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                if cap not in best or result["run_s"] < best[cap]["run_s"]:
                    best[cap] = result
        for cap in args.caps:
            r = best[cap]
            print(f"{case[0]:9} {case[1]:>4} {case[2]:>7} {case[3]:8} {'2^' + str(cap):>5} {r['first_s']:>8.1f} "
                  f"{r['run_s']:>8.2f} {1000 * r['run_s'] / case[2]:>9.2f} "
                  f"{best[args.caps[0]]['run_s'] / r['run_s']:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
