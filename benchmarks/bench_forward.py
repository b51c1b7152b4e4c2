"""Forward log Z, float32: naive JAX scan vs careful C++ vs foldax, side by side.

    taskset -c 0 python benchmarks/bench_forward.py --section single   # one core
    python benchmarks/bench_forward.py --section batch                 # two cores

Times are medians over --repeats calls after one warm-up call; JAX compile time
(lower + compile) is reported separately. Every value is checked against the C++
float64 result (the `err` column: max relative error over the batch).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root, for `layers`
from benchmarks.cpu_devices import DEVICES  # noqa: E402  (before jax)
import jax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.cpp_baseline import build, cpp_log_partition, cpp_log_partition_batch  # noqa: E402
from benchmarks.naive_scan import naive_log_partition, naive_log_partition_batch  # noqa: E402

try:
    from foldax import layers
except Exception as e:  # noqa: BLE001 - any failure just drops the column
    layers, LAYERS_ERROR = None, f"{type(e).__name__}: {e}"


def n_terms(n, h):
    """Bifurcation terms sum_d (n-d)(d-h-1): the O(n^3) work every implementation must do."""
    return sum((n - d) * (d - h - 1) for d in range(h + 2, n))


def timed(fn, repeats):
    """One warm-up call, then `repeats` timed calls; returns (median s, all runs, last value)."""
    out = fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs), runs, out


def aot(jitted, args, static):
    """Compile ahead of time so compile cost is measured apart from run time."""
    t = time.perf_counter()
    compiled = jitted.lower(*args, **static).compile()
    compile_s = time.perf_counter() - t
    return (lambda: jax.block_until_ready(compiled(*args))), compile_s


def random_params(rng):
    f32 = lambda a: np.asarray(a, np.float32)
    return {"stack": f32(rng.normal(size=(5, 5, 5, 5))), "pair": f32(rng.normal(size=(5, 5))),
            "unpaired": f32(rng.normal(size=5)), "loop": f32(rng.normal())}


def run_case(args, params, tokens, batched):
    """Times every implementation on one input; returns {impl: result dict}."""
    h = args.min_hairpin
    jparams = {k: jnp.asarray(v) for k, v in params.items()}
    jtokens = jnp.asarray(tokens)
    L = tokens.shape[-1]
    if batched:
        exact = cpp_log_partition_batch(params, tokens, None, h, dtype=np.float64, threads=args.threads)
    else:
        exact = np.array([cpp_log_partition(params, tokens, h, dtype=np.float64)])
    impls = {}
    naive_cap = args.naive_batch_max_n if batched else args.naive_max_n
    if not args.skip_naive and L <= naive_cap:
        jitted = naive_log_partition_batch if batched else naive_log_partition
        impls["naive"] = aot(jitted, (jparams, jtokens), {"min_hairpin": h})
    if batched:
        impls["cpp"] = (lambda: cpp_log_partition_batch(params, tokens, None, h, threads=args.threads), None)
    else:
        impls["cpp"] = (lambda: cpp_log_partition(params, tokens, h), None)
    if layers is not None:
        fx = jax.jit(layers.log_partition, static_argnames=("min_hairpin",))
        if batched:
            lengths = jnp.full(tokens.shape[0], L, jnp.int32)
            if DEVICES > 1:  # data parallel: the batch split over the CPU devices (one per core)
                mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(AxisType.Auto,))
                shard = NamedSharding(mesh, PartitionSpec("data"))
                jtokens, lengths = jax.device_put(jtokens, shard), jax.device_put(lengths, shard)
            impls["foldax"] = aot(fx, (jparams, jtokens, lengths), {"min_hairpin": h})
            # The same sequences one call at a time: the batch must not cost more per sequence.
            one = aot(fx, (jparams, jnp.asarray(tokens[0])), {"min_hairpin": h})
            impls["fx_1by1"] = (lambda one=one[0]: [one() for _ in range(tokens.shape[0])], one[1])
        else:
            impls["foldax"] = aot(fx, (jparams, jtokens), {"min_hairpin": h})
    results = {}
    for name, (fn, compile_s) in impls.items():
        med, runs, out = timed(fn, args.repeats)
        if name == "fx_1by1":
            out = np.asarray(out)[:1]
            ref = exact[:1]
        else:
            ref = exact
        err = np.max(np.abs(np.asarray(out, np.float64).ravel() - ref) / np.maximum(1, np.abs(ref)))
        results[name] = {"median_s": med, "runs_s": runs, "compile_s": compile_s, "max_rel_err": float(err)}
    return results


def fmt_s(r, key="median_s"):
    if r is None or r.get(key) is None:
        return "-"
    v = r[key]
    return f"{v * 1e3:.2f}ms" if v < 1 else f"{v:.3f}s"


def print_table(title, rows):
    print(f"\n{title}")
    head = ["size", "terms", "naive", "cpp", "foldax", "fx 1-by-1", "naive/fx", "cpp/fx", "1by1/fx",
            "ns/term n|c|f", "compile n|f", "err n|c|f"]
    lines = []
    for row in rows:
        r = row["results"]
        get = lambda k: r.get(k)
        ratio = lambda a: (f"{r[a]['median_s'] / r['foldax']['median_s']:.1f}x"
                           if a in r and "foldax" in r else "-")
        nst = lambda k: f"{r[k]['median_s'] / row['terms'] * 1e9:.2f}" if k in r else "-"
        err = lambda k: f"{r[k]['max_rel_err']:.0e}" if k in r else "-"
        lines.append([row["label"], f"{row['terms']:.3g}", fmt_s(get("naive")), fmt_s(get("cpp")),
                      fmt_s(get("foldax")), fmt_s(get("fx_1by1")), ratio("naive"), ratio("cpp"), ratio("fx_1by1"),
                      "|".join(nst(k) for k in ("naive", "cpp", "foldax")),
                      "|".join(fmt_s(get(k), "compile_s") for k in ("naive", "foldax")),
                      "|".join(err(k) for k in ("naive", "cpp", "foldax"))])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    for line in [head] + lines:
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=("single", "batch", "all"), default="all")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 400, 800])
    ap.add_argument("--batch", type=int, default=32, help="B for the batched section")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 256], help="L for the batched section")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="std::threads for the C++ batch")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--naive-max-n", type=int, default=10**9, help="skip naive above this n (single)")
    ap.add_argument("--naive-batch-max-n", type=int, default=10**9, help="skip naive above this L (batch)")
    ap.add_argument("--min-hairpin", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--devices", type=int, default=1,
                    help="XLA CPU devices; the foldax batch is sharded over them (use 2 for 2 cores)")
    args = ap.parse_args()

    cores = len(os.sched_getaffinity(0))
    build()  # compile the C++ library now, not inside a timing
    print(f"jax {jax.__version__}, devices {jax.devices()}, numpy {np.__version__}, "
          f"python {platform.python_version()}")
    print(f"cpu cores usable (sched_getaffinity): {cores}; "
          "single-sequence rows are meant for `taskset -c 0` (1 core), batch rows for 2 cores "
          f"(C++ batch uses {args.threads} threads)")
    print("foldax: " + ("layers.log_partition" if layers else f"skipped ({LAYERS_ERROR})")
          + f"; batch sharded over {DEVICES} device(s)")
    print(f"float32, min_hairpin={args.min_hairpin}, median of {args.repeats} after 1 warm-up; "
          "err = max |x - cpp64| / max(1, |cpp64|)")
    if args.section != "single" and cores < args.threads:
        print(f"WARNING: batch section with {cores} usable core(s) but {args.threads} C++ threads")

    rng = np.random.default_rng(args.seed)
    params = random_params(rng)
    record = {"jax": jax.__version__, "device": str(jax.devices()[0]), "cores": cores,
              "args": vars(args), "rows": []}
    if args.section in ("single", "all"):
        rows = []
        for n in args.sizes:
            tokens = rng.integers(0, 4, n).astype(np.int32)  # ACGU
            rows.append({"section": "single", "label": f"n={n}", "n": n, "B": 1,
                         "terms": n_terms(n, args.min_hairpin), "results": run_case(args, params, tokens, False)})
        print_table("single sequence", rows)
        record["rows"] += rows
    if args.section in ("batch", "all"):
        rows = []
        for L in args.batch_sizes:
            tokens = rng.integers(0, 4, (args.batch, L)).astype(np.int32)
            rows.append({"section": "batch", "label": f"{args.batch}x{L}", "n": L, "B": args.batch,
                         "terms": args.batch * n_terms(L, args.min_hairpin),
                         "results": run_case(args, params, tokens, True)})
        print_table(f"batch (B={args.batch}, equal lengths, C++ {args.threads} threads)", rows)
        record["rows"] += rows
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
