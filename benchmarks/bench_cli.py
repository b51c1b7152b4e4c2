"""How fast ``foldax fold`` answers, next to RNAfold on the same input (issue 13, "A fast command line").

Measures, each as separate processes (wall time and the process's CPU time, user + system;
medians over ``--repeats``):

1. the floor: ``python -c "import jax"``;
2. ``foldax fold`` on one 100-nt sequence: the first call ever (an empty program cache)
   and later calls (the cache filled), for ``--params`` (default ``turner2004``, and
   ``handset`` for comparison), as increments over the floor;
3. where the first call's extra time goes, in a fresh process: tracing the program
   (``jax.jit(...).lower``) and compiling it (XLA), then one run;
4. ``foldax fold -i`` on ``--n-seqs`` random sequences of 100-300 nt (batched by length
   bucket over one CPU device per core), cache filled;
5. RNAfold on the same inputs: the ``RNAfold`` binary if it is on PATH, else ViennaRNA's
   Python module in one process per call (``python -c "import RNA; ..."``, what a user
   without the binary runs; Python's start-up included).

With ``--sample S`` steps 4 and 5 draw S structures per sequence as well: ``foldax fold -i ...
--sample S`` against ``RNAsubopt -p S`` (or, without the binary, ViennaRNA's ``mfe``, ``pf`` and
``pbacktrack(S)`` per sequence in one process).

Timings on a shared machine vary with its load: CPU times are steadier than wall times.
Run::

    .venv/bin/python benchmarks/bench_cli.py                       # all of it (the Turner compile takes minutes)
    .venv/bin/python benchmarks/bench_cli.py --params handset --n-seqs 200 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDAX = [sys.executable, "-m", "foldax.cli", "fold"]

VIENNA = textwrap.dedent(
    """
    import sys, RNA
    lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
    out = []
    for name, seq in zip(lines[0::2], lines[1::2]):
        fc = RNA.fold_compound(seq)
        structure, mfe = fc.mfe()
        out.append(f"{name}\\n{seq}\\n{structure} ({mfe:6.2f})")
    sys.stdout.write("\\n".join(out) + "\\n")
    """
)


VIENNA_SAMPLE = textwrap.dedent(
    """
    import sys, RNA
    lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
    count, out = int(sys.argv[2]), []
    for name, seq in zip(lines[0::2], lines[1::2]):
        md = RNA.md()
        md.uniq_ML = 1
        fc = RNA.fold_compound(seq, md)
        structure, mfe = fc.mfe()
        fc.exp_params_rescale(mfe)
        fc.pf()
        out.append(f"{name}\\n{seq}\\n" + "\\n".join(fc.pbacktrack(count)))
    sys.stdout.write("\\n".join(out) + "\\n")
    """
)


def timed(cmd, *, env=None, stdin=None) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the child, result) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, stdin=stdin)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def median_of(cmd, repeats, **kw) -> tuple[float, float]:
    runs = [timed(cmd, **kw)[:2] for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def random_fasta(path: Path, n: int, lo: int, hi: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for k in range(n):
            fh.write(f">s{k}\n{''.join(rng.choice('ACGU') for _ in range(rng.randint(lo, hi)))}\n")


def rnafold_command(fasta: Path, samples: int = 0) -> tuple[str, list[str]]:
    if samples:
        binary = shutil.which("RNAsubopt")
        if binary:
            return f"RNAsubopt -p {samples} ({binary})", [binary, "-p", str(samples), "-i", str(fasta)]
        return (f"ViennaRNA Python (mfe, pf, pbacktrack({samples}), 1 process)",
                [sys.executable, "-c", VIENNA_SAMPLE, str(fasta), str(samples)])
    binary = shutil.which("RNAfold")
    if binary:
        return f"RNAfold ({binary}, --noPS)", [binary, "--noPS", "-i", str(fasta)]
    return "ViennaRNA Python (RNA.fold_compound().mfe(), 1 process)", [sys.executable, "-c", VIENNA, str(fasta)]


BREAKDOWN = textwrap.dedent(
    """
    import sys, time, json
    t0 = time.perf_counter()
    import jax, functools, numpy as np
    t1 = time.perf_counter()
    from foldax import parameters, programs
    from foldax import layers
    params, _ = parameters.load(sys.argv[1])
    params = jax.tree.map(np.asarray, layers.check_params(params))
    tokens, lengths = layers.encode_batch([sys.argv[2]])
    args = (params, tokens, lengths, None, np.float32(1))
    request = programs.Request(energy=layers.is_energy_params(params),
                               num_chunks=programs.num_chunks_for(*tokens.shape))  # as foldax fold chooses
    t2 = time.perf_counter()
    lowered = jax.jit(functools.partial(programs.fold_batch, request=request)).lower(*args)
    t3 = time.perf_counter()
    compiled = lowered.compile()
    t4 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t5 = time.perf_counter()
    print(json.dumps({"import_jax": t1 - t0, "imports_and_params": t2 - t1, "trace": t3 - t2, "compile": t4 - t3,
                      "run": t5 - t4}))
    """
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", nargs="+", default=["turner2004", "handset"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n-seqs", type=int, default=1000)
    parser.add_argument("--length", type=int, default=100, help="length of the single sequence")
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--sample", type=int, default=0, metavar="S",
                        help="the batch steps also draw S structures per sequence (foldax fold --sample S, RNAsubopt -p S)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_cli_"))
    one = work / "one.fa"
    random_fasta(one, 1, args.length, args.length, seed=1)
    seq = one.read_text().split()[1]
    many = work / "many.fa"
    random_fasta(many, args.n_seqs, 100, 300, seed=2)
    rows = []

    def row(what, wall, cpu, floor=None):
        extra = "" if floor is None else f"{wall - floor[0]:+.2f} s / {cpu - floor[1]:+.2f} s"
        rows.append(f"| {what} | {wall:.2f} | {cpu:.2f} | {extra} |")
        print(rows[-1], flush=True)

    print(f"# machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; inputs in {work}")
    print("| command | wall (s) | CPU (s) | over `import jax` (wall / CPU) |\n|---|---:|---:|---:|")
    floor = median_of([sys.executable, "-c", "import jax"], args.repeats)
    row('`python -c "import jax"`', *floor)
    for params in args.params:
        cache = work / f"cache_{params}"
        env = dict(os.environ, FOLDAX_CACHE_DIR=str(cache))
        first = timed([*FOLDAX, "--params", params, str(one)], env=env)
        row(f"`foldax fold --params {params}` 1 x {args.length} nt, first call (empty cache)", *first[:2], floor)
        warm = median_of([*FOLDAX, "--params", params, str(one)], args.repeats, env=env)
        row(f"`foldax fold --params {params}` 1 x {args.length} nt, later calls", *warm, floor)
        _, _, proc = timed([sys.executable, "-c", BREAKDOWN, params, seq])
        parts = proc.stdout.strip().splitlines()[-1]
        print(f"#   first call, in one fresh process ({params}): {parts}")
        if not args.skip_batch:
            sampling = ["--sample", str(args.sample), "--seed", "1"] if args.sample else []
            command = [*FOLDAX, "--params", params, "-i", str(many), *sampling]
            timed(command, env=env)  # fills the cache for every bucket
            batch = median_of(command, max(1, args.repeats // 2), env=env)
            row(f"`foldax fold --params {params} -i` {args.n_seqs} x 100-300 nt {' '.join(sampling)}, cache filled",
                *batch)
    name, cmd = rnafold_command(one)
    row(f"{name}, 1 x {args.length} nt", *median_of(cmd, args.repeats), floor)
    if not args.skip_batch:
        name, cmd = rnafold_command(many, args.sample)
        row(f"{name}, {args.n_seqs} x 100-300 nt", *median_of(cmd, max(1, args.repeats // 2)))
    print("\n".join(["", "| command | wall (s) | CPU (s) | over `import jax` (wall / CPU) |", "|---|---:|---:|---:|",
                     *rows]))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
