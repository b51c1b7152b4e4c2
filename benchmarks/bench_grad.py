"""Cost of gradients and decoding in foldax: peak memory and time against the forward pass.

    python benchmarks/bench_grad.py --section memory               # one fresh subprocess per row
    taskset -c 0 python benchmarks/bench_grad.py --section time    # single sequences, one core
    python benchmarks/bench_grad.py --section batch --devices 2    # B=32 x L=256, both cores

memory: peak resident memory of one call of the compiled program above the process's
  resident memory just before it (JAX runtime, compiled code and inputs already loaded).
  Each row runs in a fresh interpreter: compile, one warm-up call, ``malloc_trim``, reset
  the kernel's high-water mark (``/proc/self/clear_refs``), one measured call, read
  ``VmHWM``. ``xla`` is XLA's own static estimate for the program (temporaries + outputs,
  ``compiled.memory_analysis()``). "grad" is ``value_and_grad`` w.r.t. all params.
time: medians over --repeats calls after a warm-up, float32, random params (std 1).
batch: ``pair_probs`` / ``best_structure`` (one inside + one outside pass) against the
  batched forward ``log_partition`` on the same padded batch.
"""

import argparse
import ctypes
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root, for `layers`
from benchmarks.cpu_devices import DEVICES  # noqa: E402  (before jax)
import jax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from foldax import layers  # noqa: E402
from benchmarks.naive_scan import naive_log_partition  # noqa: E402
from foldax.layers.decoding import best_structure, pair_probs  # noqa: E402

MB = 2**20


def random_params(rng):
    shapes = {"stack": (5, 5, 5, 5), "pair": (5, 5), "unpaired": (5,), "loop": ()}
    return {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}


def program(impl, mode, n, seed=0):
    """A jitted function and its arguments: log Z of one random sequence of length n."""
    rng = np.random.default_rng(seed)
    params, tokens = random_params(rng), jnp.asarray(rng.integers(0, 4, n), jnp.int32)
    value = {"foldax": layers.log_partition, "naive": naive_log_partition}[impl]
    fn = (lambda p, x: value(p, x)) if mode == "forward" else jax.value_and_grad(lambda p, x: value(p, x))
    return jax.jit(fn), (params, tokens)


def timed(fn, repeats):
    jax.block_until_ready(fn())
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def compiled(fn, args):
    t = time.perf_counter()
    exe = fn.lower(*args).compile()
    return exe, time.perf_counter() - t


# ------------------------------------------------------------------ memory


def _status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_memory(impl, mode, n):
    """Runs in the child process: returns the measurement as a dict."""
    fn, args = program(impl, mode, n)
    exe, compile_s = compiled(fn, args)
    stats = exe.memory_analysis()
    jax.block_until_ready(exe(*args))  # warm-up: lazy runtime allocations happen here
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed compile/warm-up memory to the OS
    base = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    t = time.perf_counter()
    jax.block_until_ready(exe(*args))
    seconds = time.perf_counter() - t
    peak = _status_kb("VmHWM")
    return {"impl": impl, "mode": mode, "n": n, "peak_mb": (peak - base) / 1024, "base_mb": base / 1024,
            "xla_mb": (stats.temp_size_in_bytes + stats.output_size_in_bytes) / MB,
            "run_s": seconds, "compile_s": compile_s}


def memory_section(args):
    cases = [("foldax", "forward", 800), ("foldax", "grad", 800), ("foldax", "grad", 2000)]
    if not args.skip_naive:
        cases += [("naive", "forward", 400), ("naive", "grad", 400)]
    print("\npeak memory of one call above the loaded process (fresh subprocess per row); target: grad n=800 <= 100 MB")
    print(f"{'impl':>7} {'mode':>8} {'n':>5} {'peak MB':>9} {'xla MB':>8} {'base MB':>8} {'run':>8} {'compile':>8}")
    rows = []
    for impl, mode, n in cases:
        cmd = [sys.executable, __file__, "--measure", f"{impl}:{mode}:{n}"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(f"{impl:>7} {mode:>8} {n:>5} {r['peak_mb']:9.1f} {r['xla_mb']:8.1f} {r['base_mb']:8.1f} "
              f"{r['run_s']:7.2f}s {r['compile_s']:7.1f}s", flush=True)
    return rows


# -------------------------------------------------------------------- time


def time_section(args):
    print(f"\nsingle sequence, median of {args.repeats}; target: value_and_grad / forward <= 3x")
    print(f"{'n':>5} {'forward':>9} {'grad':>9} {'ratio':>6} {'compile f|g':>13}")
    rows = []
    for n in args.sizes:
        res = {}
        for mode in ("forward", "grad"):
            fn, fargs = program("foldax", mode, n)
            exe, compile_s = compiled(fn, fargs)
            res[mode] = (timed(lambda: exe(*fargs), args.repeats), compile_s)
        ratio = res["grad"][0] / res["forward"][0]
        rows.append({"n": n, "forward_s": res["forward"][0], "grad_s": res["grad"][0], "ratio": ratio})
        print(f"{n:>5} {res['forward'][0] * 1e3:7.1f}ms {res['grad'][0] * 1e3:7.1f}ms {ratio:5.2f}x "
              f"{res['forward'][1]:5.1f}s|{res['grad'][1]:5.1f}s", flush=True)
    return rows


def batch_section(args):
    rng = np.random.default_rng(args.seed)
    params = random_params(rng)
    B, L = args.batch, args.batch_length
    tokens = jnp.asarray(rng.integers(0, 4, (B, L)), jnp.int32)
    lengths = jnp.asarray(rng.integers(L // 2, L + 1, B), jnp.int32)
    if DEVICES > 1:  # data parallel: the batch split over the CPU devices (one per core)
        mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(AxisType.Auto,))
        shard = NamedSharding(mesh, PartitionSpec("data"))
        tokens, lengths = jax.device_put(tokens, shard), jax.device_put(lengths, shard)
    fns = {
        "log_partition": jax.jit(lambda p, x, n: layers.log_partition(p, x, n)),
        "pair_probs": jax.jit(lambda p, x, n: pair_probs(p, x, n)),
        "best_structure": jax.jit(lambda p, x, n: best_structure(p, x, n)),
    }
    print(f"\nbatch {B} x {L} (lengths {L // 2}..{L}) on {DEVICES} device(s), median of {args.repeats}; "
          "target: pair_probs / forward <= 3x")
    rows, base = [], None
    for name, fn in fns.items():
        exe, compile_s = compiled(fn, (params, tokens, lengths))
        t = timed(lambda: exe(params, tokens, lengths), args.repeats)
        base = base or t
        rows.append({"name": name, "s": t, "ratio": t / base})
        print(f"{name:>15} {t * 1e3:8.1f}ms {t / base:5.2f}x  (compile {compile_s:.1f}s)", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=("memory", "time", "batch", "all"), default="all")
    ap.add_argument("--sizes", type=int, nargs="+", default=[200, 400, 800])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batch-length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-naive", action="store_true", help="memory: skip the naive scan rows (n=400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", type=int, default=1,
                    help="XLA CPU devices; the batch section shards its batch over them (2 for 2 cores)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # child process: impl:mode:n
    args = ap.parse_args()
    if args.measure:
        impl, mode, n = args.measure.split(":")
        print(json.dumps(measure_memory(impl, mode, int(n))))
        return
    print(f"jax {jax.__version__}, {jax.devices()[0]}, float32, min_hairpin=3")
    record = {}
    for name, section in (("memory", memory_section), ("time", time_section), ("batch", batch_section)):
        if args.section in (name, "all"):
            record[name] = section(args)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
