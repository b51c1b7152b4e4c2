"""Cost of a gradient through base-pair probabilities (a second derivative of log Z), next to
``pair_probs`` itself: one sequence, float32, random ACGU.

    taskset -c 0 .venv/bin/python benchmarks/bench_second_order.py --sizes 200 400 --repeats 3

The loss is ``sum(W * pair_probs(params, x))`` for a fixed random ``W`` (a design or probing loss);
its gradient with respect to every parameter runs the inside and outside passes forward-mode
differentiated (``jax.jvp`` through the engine's loops) once per direction XLA needs, so it is timed
and its memory (XLA's temp-buffer estimate, ``compiled.memory_analysis()``) reported per n, for the
stacking grammar and the Turner 2004 grammar.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from foldax import layers


def _time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 400])
    ap.add_argument("--grammars", nargs="+", default=["stacking", "turner"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("grammar     n   pair_probs  grad(sum W*P)  ratio   temp MB pp|grad   compile pp|grad")
    for grammar in args.grammars:
        params = layers.turner2004() if grammar == "turner" else layers.init_params(jax.random.key(0))
        for n in args.sizes:
            x = jnp.asarray(rng.integers(0, 4, n), jnp.int32)
            w = jnp.asarray(rng.normal(size=(n, n)), jnp.float32)
            pp = jax.jit(layers.pair_probs)
            grad = jax.jit(jax.grad(lambda p, x, w: jnp.sum(w * layers.pair_probs(p, x))))
            t0 = time.perf_counter()
            pp_c = pp.lower(params, x).compile()
            t1 = time.perf_counter()
            grad_c = grad.lower(params, x, w).compile()
            t2 = time.perf_counter()
            t_pp = _time(pp_c, params, x, repeats=args.repeats)
            t_grad = _time(grad_c, params, x, w, repeats=args.repeats)
            mem = [c.memory_analysis().temp_size_in_bytes / 2**20 for c in (pp_c, grad_c)]
            print(f"{grammar:9s} {n:5d} {t_pp * 1e3:10.1f}ms {t_grad * 1e3:12.1f}ms {t_grad / t_pp:6.2f}x "
                  f"{mem[0]:8.1f}|{mem[1]:<8.1f} {t1 - t0:6.1f}s|{t2 - t1:.1f}s", flush=True)


if __name__ == "__main__":
    main()
