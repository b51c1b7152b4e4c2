"""Turner 2004 grammar: foldax against ViennaRNA, side by side in one run (float32).

    taskset -c 0 python benchmarks/bench_turner.py --section single        # pf + bpp, one core
    taskset -c 0 python benchmarks/bench_turner.py --section single --no-lonely-pairs  # RNAfold --noLP
    python benchmarks/bench_turner.py --section batch --devices 2          # 64 x 200 nt, both cores
    taskset -c 0 python benchmarks/bench_turner.py --section grad          # value_and_grad vs forward
    python benchmarks/bench_turner.py --section memory                     # peak memory, subprocesses
    python benchmarks/bench_turner.py --section throughput --json out.json # on an accelerator

single: ``layers.pair_probs`` (one inside and one outside pass: ViennaRNA's pf + bpp) of
  one random sequence, against ViennaRNA's ``fc.pf()`` with base-pair probabilities
  (``md.compute_bpp = 1``, ``md.pf_smooth = 0``, after ``exp_params_rescale(mfe)``; the MFE
  pass is not timed), and the forward ``log_partition`` alone. Medians after a warm-up;
  compile time apart. ``--no-lonely-pairs``: both sides without lonely pairs (foldax's
  ``no_lonely_pairs=True``, ViennaRNA's ``md.noLP = 1``), and foldax's default grammar timed
  beside it (the column ``noLP/dflt``).
batch: ``pair_probs`` of 64 random 200-nt sequences, the batch sharded over ``--devices``
  XLA CPU devices (one per core), against ViennaRNA in ``--devices`` processes
  (``multiprocessing``, one sequence at a time). ``--rows-per-call M``: the batch as calls of
  M rows each (each call sharded likewise), as ``foldax fold`` batches Turner parameters.
grad: ``jax.value_and_grad`` of ``log_partition`` w.r.t. every table against the forward.
throughput: sequences per second of ``pair_probs`` and of ``value_and_grad`` of the batch's summed
  ``log_partition`` (a training step's core) on JAX's default device (a GPU or TPU where there is
  one), for batches of ``--batches`` random sequences of each length in ``--sizes``. ``--json``
  also saves, per length, the first 8 sequences with their ensemble free energies (and the pair
  probabilities of the first 2), to check the device's float32 values against ViennaRNA elsewhere
  (``--check out.json``, on a machine with ViennaRNA). A batch that does not fit in the device's
  memory is reported and skipped.
memory: peak resident memory of one value_and_grad call above the process's memory just
  before it (compiled, warmed up, ``malloc_trim``; fresh interpreter per row), like
  ``bench_grad.py --section memory``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root, for `layers`
from benchmarks.cpu_devices import DEVICES  # noqa: E402  (before jax)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from foldax import layers  # noqa: E402

MB = 2**20
FLOAT32_TOLERANCE = 1e-4  # issue 11's float32 target for the partition function (relative)
FLOAT32_PAIR_TOLERANCE = 1e-3  # and for pair probabilities (absolute)


def random_sequence(rng, n):
    return "".join(rng.choice(list("ACGU"), n))


def timed(fn, repeats):
    jax.block_until_ready(fn())
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def compiled(fn, *args):
    t = time.perf_counter()
    program = jax.jit(fn).lower(*args).compile()
    return program, time.perf_counter() - t


def vienna_pf_bpp(sequence, no_lp=False):
    """Seconds of ViennaRNA's pf with base-pair probabilities (MFE for the scale not timed)."""
    import RNA

    md = RNA.md()
    md.noLP = int(no_lp)
    md.pf_smooth = 0
    md.compute_bpp = 1
    fc = RNA.fold_compound(sequence, md)
    _, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    t = time.perf_counter()
    fc.pf()
    fc.bpp()
    return time.perf_counter() - t


def single(args):
    rng = np.random.default_rng(0)
    params = layers.turner2004()
    no_lp = args.no_lonely_pairs
    print(f"pf + bpp of one sequence, float32 (ViennaRNA: fc.pf() with bpp){', no lonely pairs' if no_lp else ''}")
    print(f"{'n':>6} {'ViennaRNA':>11} {'foldax pp':>11} {'fx/VRNA':>8} {'fx fwd':>10} {'compile pp|fwd':>16}"
          + (f" {'noLP/dflt':>10}" if no_lp else ""))
    rows = []
    for n in args.sizes:
        seq = random_sequence(rng, n)
        x = layers.encode(seq)
        vienna = statistics.median(vienna_pf_bpp(seq, no_lp) for _ in range(max(1, args.repeats // 2)))
        pp, c_pp = compiled(lambda p, x: layers.pair_probs(p, x, no_lonely_pairs=no_lp), params, x)
        fwd, c_fwd = compiled(lambda p, x: layers.log_partition(p, x, no_lonely_pairs=no_lp), params, x)
        t_pp = timed(lambda: pp(params, x), args.repeats)
        t_fwd = timed(lambda: fwd(params, x), args.repeats)
        row = {"n": n, "vienna_s": vienna, "pp_s": t_pp, "fwd_s": t_fwd, "compile_pp_s": c_pp,
               "compile_fwd_s": c_fwd}
        line = (f"{n:>6} {vienna * 1e3:>9.1f}ms {t_pp * 1e3:>9.1f}ms {t_pp / vienna:>8.2f} {t_fwd * 1e3:>8.1f}ms "
                f"{c_pp:>7.1f}s|{c_fwd:.1f}s")
        if no_lp:
            default, _ = compiled(lambda p, x: layers.pair_probs(p, x), params, x)
            row["pp_default_s"] = timed(lambda: default(params, x), args.repeats)
            line += f" {t_pp / row['pp_default_s']:>10.2f}"
        rows.append(row)
        print(line, flush=True)
    return rows


def _vienna_worker(sequences):
    return sum(vienna_pf_bpp(s) for s in sequences)


def batch(args):
    rng = np.random.default_rng(1)
    params = layers.turner2004()
    seqs = [random_sequence(rng, args.batch_length) for _ in range(args.batch)]
    tokens, lengths = layers.encode_batch(seqs)
    devices = jax.devices()
    rows = args.rows_per_call or args.batch
    if args.batch % rows or rows % len(devices):
        raise SystemExit(f"--rows-per-call {rows} must divide --batch {args.batch} and be a multiple of the "
                         f"{len(devices)} device(s)")
    calls = [(tokens[s:s + rows], lengths[s:s + rows]) for s in range(0, args.batch, rows)]
    if len(devices) > 1:
        mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        calls = [jax.device_put(call, sharding) for call in calls]
    pp, c_pp = compiled(lambda p, x, n: layers.pair_probs(p, x, n), params, *calls[0])
    t_pp = timed(lambda: [pp(params, *call) for call in calls], args.repeats)
    procs = max(1, len(devices))
    chunks = [seqs[k::procs] for k in range(procs)]
    t = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        pool.map(_vienna_worker, chunks)
    t_vienna = time.perf_counter() - t
    print(f"pair_probs, batch {args.batch} x {args.batch_length} nt in calls of {rows}, {len(devices)} device(s) "
          f"vs ViennaRNA in {procs} process(es)")
    print(f"  foldax {t_pp * 1e3:.0f} ms ({args.batch / t_pp:.1f} seq/s), ViennaRNA {t_vienna * 1e3:.0f} ms "
          f"({args.batch / t_vienna:.1f} seq/s): throughput ratio {t_vienna / t_pp:.2f}x; compile {c_pp:.1f}s")
    return {"batch": args.batch, "rows_per_call": rows, "length": args.batch_length, "devices": len(devices),
            "foldax_s": t_pp, "vienna_s": t_vienna, "compile_s": c_pp}


def grad(args):
    rng = np.random.default_rng(2)
    params = layers.turner2004()
    print("value_and_grad (all tables) vs forward, one sequence, float32")
    rows = []
    for n in args.sizes:
        x = layers.encode(random_sequence(rng, n))
        fwd, c_fwd = compiled(lambda p, x: layers.log_partition(p, x), params, x)
        vg, c_vg = compiled(jax.value_and_grad(lambda p, x: layers.log_partition(p, x)), params, x)
        t_fwd = timed(lambda: fwd(params, x), args.repeats)
        t_vg = timed(lambda: vg(params, x), args.repeats)
        rows.append({"n": n, "fwd_s": t_fwd, "vg_s": t_vg, "compile_fwd_s": c_fwd, "compile_vg_s": c_vg})
        print(f"  n={n}: forward {t_fwd * 1e3:.1f} ms, value_and_grad {t_vg * 1e3:.1f} ms ({t_vg / t_fwd:.2f}x); "
              f"compile {c_fwd:.1f}s | {c_vg:.1f}s", flush=True)
    return rows


def throughput(args):
    device = jax.devices()[0]
    print(f"throughput on {device.platform} ({device.device_kind}), float32, jax {jax.__version__}")
    params = layers.turner2004()
    pp_program = jax.jit(lambda p, x, n: layers.pair_probs(p, x, n))
    vg_program = jax.jit(jax.value_and_grad(lambda p, x, n: jnp.sum(layers.log_partition(p, x, n))))
    energy = jax.jit(lambda p, x, n: layers.ensemble_free_energy(p, x, n))
    rows, checks = [], []
    for n in args.sizes:
        rng = np.random.default_rng(4)
        seqs = [random_sequence(rng, n) for _ in range(max(args.batches))]
        tokens, lengths = layers.encode_batch(seqs)
        head = slice(0, 8)
        pairs = slice(0, 2)  # [2, n, n]: a few hundred kB in the JSON
        checks.append({"n": n, "sequences": seqs[head],
                       "ensemble_free_energy": np.asarray(energy(params, tokens[head], lengths[head])).tolist(),
                       "pair_probs": np.asarray(pp_program(params, tokens[pairs], lengths[pairs])).tolist()})
        for b in args.batches:
            x, ln = jax.device_put((tokens[:b], lengths[:b]), device)
            row = {"n": n, "batch": b, "platform": device.platform}
            for name, program in (("pair_probs", pp_program), ("value_and_grad", vg_program)):
                try:
                    t = time.perf_counter()
                    compiled_program = program.lower(params, x, ln).compile()
                    row[f"compile_{name}_s"] = time.perf_counter() - t
                    row[f"{name}_s"] = timed(lambda: compiled_program(params, x, ln), args.repeats)
                except Exception as err:  # noqa: BLE001  (out of device memory: report, go on)
                    row[f"{name}_error"] = str(err).splitlines()[0][:200]
            rows.append(row)
            cells = [f"{name} " + (f"{b / row[name + '_s']:8.1f} seq/s ({row[name + '_s'] * 1e3:.0f} ms, "
                                   f"compile {row['compile_' + name + '_s']:.0f} s)" if name + "_s" in row
                                   else "failed: " + row[name + "_error"][:60])
                     for name in ("pair_probs", "value_and_grad")]
            print(f"  {n:>5} nt x {b:>4}: " + "; ".join(cells), flush=True)
    return {"device": f"{device.platform} ({device.device_kind})", "jax": jax.__version__, "rows": rows,
            "checks": checks}


def check(path):
    """The ensemble free energies and pair probabilities a ``throughput`` run saved, against ViennaRNA's
    ``pf()`` and ``bpp()``; exits nonzero past the float32 targets."""
    import RNA

    saved = json.loads(Path(path).read_text())
    print(f"ensemble free energies and pair probabilities from {saved['device']} against ViennaRNA")
    for entry in saved["checks"]:
        worst, worst_pp = 0.0, 0.0
        for k, (seq, g) in enumerate(zip(entry["sequences"], entry["ensemble_free_energy"])):
            md = RNA.md()
            md.pf_smooth = 0
            fc = RNA.fold_compound(seq, md)
            _, mfe = fc.mfe()
            fc.exp_params_rescale(mfe)
            _, reference = fc.pf()
            worst = max(worst, abs(g - reference) / abs(reference))
            if k < len(entry.get("pair_probs", [])):
                n = len(seq)
                bpp = np.asarray(fc.bpp())[1:n + 1, 1:n + 1]
                got = np.asarray(entry["pair_probs"][k])[:n, :n]
                worst_pp = max(worst_pp, float(np.abs(got - (bpp + bpp.T)).max()))
        print(f"  n={entry['n']}: {len(entry['sequences'])} sequences, largest relative difference {worst:.1e}; "
              f"pair probabilities of {len(entry.get('pair_probs', []))}: largest difference {worst_pp:.1e}")
        if worst > FLOAT32_TOLERANCE:
            raise SystemExit(f"n={entry['n']}: {worst:.1e} above the float32 target {FLOAT32_TOLERANCE:g}")
        if worst_pp > FLOAT32_PAIR_TOLERANCE:
            raise SystemExit(f"n={entry['n']}: pair probabilities {worst_pp:.1e} off, above the float32 target "
                             f"{FLOAT32_PAIR_TOLERANCE:g}")


def _rss_mb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory_row(n):
    rng = np.random.default_rng(3)
    params = layers.turner2004()
    x = layers.encode(random_sequence(rng, n))
    vg, _ = compiled(jax.value_and_grad(lambda p, x: layers.log_partition(p, x)), params, x)
    jax.block_until_ready(vg(params, x))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss_mb("VmRSS")
    jax.block_until_ready(vg(params, x))
    peak = _rss_mb("VmHWM")
    return {"n": n, "peak_above_baseline_mb": peak - base}


def memory(args):
    print("peak memory of value_and_grad above the process baseline (fresh process per row)")
    rows = []
    for n in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--memory-row", str(n)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  n={n}: failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"  n={n}: {row['peak_above_baseline_mb']:.0f} MB", flush=True)
    return rows


def main():
    from foldax import hugepages

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", choices=["single", "batch", "grad", "memory", "throughput"], default="single")
    ap.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-length", type=int, default=200)
    ap.add_argument("--rows-per-call", type=int, default=None, help="batch section: calls of this many rows")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--no-lonely-pairs", action="store_true", help="single section: RNAfold's --noLP on both sides")
    ap.add_argument("--json", default=None)
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[16, 64, 256],
                    help="throughput section: batch sizes")
    ap.add_argument("--check", default=None, help="a throughput run's --json file: its values against ViennaRNA")
    ap.add_argument("--memory-row", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.check:
        check(args.check)
        return
    if args.memory_row is not None:
        print(json.dumps(memory_row(args.memory_row)))
        return
    defaults = {"single": [200, 500, 1000, 2000], "grad": [200, 500, 1000], "memory": [1000, 4000],
                "throughput": [200, 500]}
    args.sizes = args.sizes or defaults.get(args.section, [])
    sections = {"single": single, "batch": batch, "grad": grad, "memory": memory, "throughput": throughput}
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    print(f"huge pages for XLA's buffers: {'on' if hugepages.TUNABLE in tunables else 'off'} "
          f"(GLIBC_TUNABLES={tunables!r}, kernel THP mode {hugepages.thp_mode()!r})")
    result = sections[args.section](args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    from foldax import hugepages

    hugepages.reexec_with_huge_pages()  # as the foldax command does (FOLDAX_HUGE_PAGES=0: without)
    main()
