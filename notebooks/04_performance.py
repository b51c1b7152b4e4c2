# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Performance: foldax vs the naive scan, profiling, and what made the difference
#
# The baseline, `benchmarks/naive_scan.py`, is the inside algorithm as one writes it
# first: a `lax.scan` over diagonals carrying three full `(n+1) x (n+1)` charts, the
# bifurcation as a `logsumexp` over full rows for every row, and `.at[i, j].set(...)`
# writes. foldax (`layers/chart.py`) computes exactly the same numbers.
#
# 1. time and memory of the forward pass and the gradient at n = 100 and 200;
# 2. how to profile with `jax.profiler`;
# 3. what made the difference: the layout, the chunks, in-place row updates, the
#    batch-major layout and the outside pass (vjp of one diagonal) -- each with a small check.
#
# Small sizes so that the notebook runs in about a minute on a 2-core CPU (mostly XLA
# compilation); `benchmarks/bench_forward.py` measures larger ones. Absolute numbers
# depend on the machine (and on what else runs on it); the ratios are the point.

# %%
# %matplotlib inline
import pathlib
import sys

_root = next((p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents] if (p / "layers" / "chart.py").exists()), None)
if _root is not None and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))

import glob
import gzip
import json
import os
import re
import tempfile
import time
import types
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foldax import layers
import foldax.layers.chart  # noqa: F401 (layers.chart below)
from benchmarks.naive_scan import naive_log_partition

print("jax", jax.__version__, "on", jax.devices()[0].device_kind, f"({os.cpu_count()} CPUs)")

SIZES = (100, 200)
# Static diagonal chunks of foldax's loop. The default, min(12, n // 32), is 6 at n = 200:
# a little less padded work, but twice the compile time. 3 keeps this notebook quick.
CHUNKS = 3
params = layers.default_params()
rng = np.random.default_rng(0)
sequences = {n: jnp.asarray(rng.integers(0, 4, n), jnp.int32) for n in SIZES}

# %% [markdown]
# ## 1. Time and memory, forward and gradient
#
# Each function is compiled ahead of time with `jax.jit(f).lower(*args).compile()`,
# which gives the compile time separately and the executable's
# `memory_analysis()`: `temp_size_in_bytes` is the scratch memory XLA allocates for
# one call (for the gradient that includes everything kept for the backward pass).
# Run time: the fastest of a few calls after a warm-up (the minimum is the least
# disturbed by whatever else runs on the machine).


# %%
def measure(fn, *args, reps=7):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    memory = compiled.memory_analysis()
    temp_mb = memory.temp_size_in_bytes / 2**20 if memory is not None else float("nan")
    return {"compile_s": compile_s, "run_ms": 1e3 * min(times), "temp_mb": temp_mb, "compiled": compiled}


def foldax_fwd(p, x):
    return layers.log_partition(p, x, num_chunks=CHUNKS)


def naive_fwd(p, x):
    return naive_log_partition(p, x)


functions = {
    ("foldax", "forward"): foldax_fwd,
    ("foldax", "gradient"): jax.grad(foldax_fwd),
    ("naive", "forward"): naive_fwd,
    ("naive", "gradient"): jax.grad(naive_fwd),
}
results = {}
for n in SIZES:
    for (impl, what), fn in functions.items():
        results[impl, what, n] = measure(fn, params, sequences[n])

print(f"{'n':>4} {'pass':<9} {'impl':<7} {'compile s':>9} {'run ms':>8} {'temp MB':>8}   speed-up  memory")
for n in SIZES:
    for what in ("forward", "gradient"):
        for impl in ("naive", "foldax"):
            r = results[impl, what, n]
            base = results["naive", what, n]
            extra = (f"   {base['run_ms'] / r['run_ms']:6.1f}x {base['temp_mb'] / r['temp_mb']:6.1f}x"
                     if impl == "foldax" else "")
            print(f"{n:>4} {what:<9} {impl:<7} {r['compile_s']:9.2f} {r['run_ms']:8.2f} {r['temp_mb']:8.2f}{extra}")

# Same log Z. The naive *gradient*, though, is NaN in about 40% of its entries: autodiff
# through logaddexp / where over impossible (-inf) cells gives -inf - -inf (the usual
# -inf gradient trap). foldax's outside pass handles -inf explicitly (its gradient is
# checked against finite differences and brute-force enumeration in tests/test_inside.py).
# As a *timing* baseline the naive gradient still does all its work.
for n in SIZES:
    a = results["foldax", "forward", n]["compiled"](params, sequences[n])
    b = results["naive", "forward", n]["compiled"](params, sequences[n])
    ga = jax.tree.map(np.asarray, results["foldax", "gradient", n]["compiled"](params, sequences[n]))
    gb = jax.tree.map(np.asarray, results["naive", "gradient", n]["compiled"](params, sequences[n]))
    nan_a, nan_b = (sum(int(np.isnan(g[k]).sum()) for k in g) for g in (ga, gb))
    print(f"n={n}: log Z {float(a):.4f} (foldax) vs {float(b):.4f} (naive); NaN gradient entries: "
          f"foldax {nan_a}, naive {nan_b} of 656")

# %%
fig = Figure(figsize=(10, 3.6))
FigureCanvasAgg(fig)
for k, (key, label) in enumerate((("run_ms", "run time (ms)"), ("temp_mb", "temp memory (MB)"))):
    ax = fig.add_subplot(1, 2, k + 1)
    groups = [(what, n) for what in ("forward", "gradient") for n in SIZES]
    x = np.arange(len(groups))
    for offset, impl in ((-0.2, "naive"), (0.2, "foldax")):
        ax.bar(x + offset, [results[impl, what, n][key] for what, n in groups], width=0.4, label=impl)
    ax.set_xticks(x, [f"{what}\nn={n}" for what, n in groups])
    ax.set_yscale("log")
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
fig.tight_layout()
fig

# %% [markdown]
# ## 2. Profiling with `jax.profiler`
#
# `jax.profiler.trace(dir)` records everything JAX runs inside the block (host Python
# ranges, XLA executables and, on CPU, each thunk / fusion; on a GPU, the kernels).
# `TraceAnnotation` labels a range of host code. Open the result with:
#
# * **TensorBoard's profile plugin / XProf**: `pip install tensorboard
#   tensorboard-plugin-profile` then `tensorboard --logdir DIR` (Profile tab), or
#   `pip install xprof` then `xprof --logdir DIR`. It reads `plugins/profile/*/*.xplane.pb`.
# * **Perfetto**: with `create_perfetto_trace=True` the trace is also written as
#   `perfetto_trace.json.gz`; drag it onto <https://ui.perfetto.dev>.
#   (`create_perfetto_link=True` prints a link and waits until it is opened.)
#
# Profile already-compiled functions (as here), or compilation dominates the trace.

# %%
trace_dir = tempfile.mkdtemp(prefix="foldax-trace-")
grad_200 = results["foldax", "gradient", 200]["compiled"]
naive_200 = results["naive", "gradient", 200]["compiled"]
with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(3):
        with jax.profiler.TraceAnnotation("foldax gradient n=200"):
            jax.block_until_ready(grad_200(params, sequences[200]))
    with jax.profiler.TraceAnnotation("naive gradient n=200"):
        jax.block_until_ready(naive_200(params, sequences[200]))
for path in sorted(glob.glob(os.path.join(trace_dir, "**", "*"), recursive=True)):
    if os.path.isfile(path):
        print(os.path.relpath(path, trace_dir), f"{os.path.getsize(path) / 1024:.0f} KiB")

# %% [markdown]
# The Perfetto file is Chrome trace-event JSON, so a quick summary needs no viewer:
# the time inside our annotations, and the XLA operations (fusions, thunks) that took
# the most time (host-side Python events start with `$`).

# %%
perfetto = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
if perfetto:
    with gzip.open(perfetto[0], "rt") as fh:
        events = json.load(fh)
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals = Counter()
    for event in events:
        if event.get("ph") == "X" and "dur" in event:
            totals[event.get("name", "?")] += event["dur"] / 1e3
    for name in ("foldax gradient n=200", "naive gradient n=200"):
        print(f"{totals[name]:9.2f} ms  {name}  (annotation)")
    print("top XLA operations:")
    ops = Counter({k: v for k, v in totals.items()
                   if not k.startswith(("$", "ThunkExecutor", "PjitFunction", "CommonPjRt"))
                   and "gradient n=" not in k})
    for name, ms in ops.most_common(8):
        print(f"{ms:9.2f} ms  {name[:90]}")
else:
    print("no perfetto_trace.json.gz written by this jax version; open the .xplane.pb with XProf")

# %% [markdown]
# ## 3. What made the difference
#
# ### (a) Width-indexed charts: each diagonal's operands are plain slices
#
# The O(n^3) work is the bifurcation: for every cell (i, j) on diagonal d = j - i,
# $Z_n[i][j] = \bigoplus_{k} F[i][k] + Z[k+1][j]$. The naive scan reads *full rows*
# `P[i, :] + Z[1:, j].T` for all n rows every step (n^3 terms in all, ~6x the useful
# ones) and writes cells with scatters. foldax stores the charts by *width*:
# `F[b, w, i] = F[i][i+w]` and, reversed and indexed by span end,
# `Zr[b, L-w, j] = Z[j-w][j]`. Then all split terms of diagonal d are the sum of two
# rectangular slices, `F[:, 0:d, 0:n-d]` and `Zr[:, L-d+1 : L+1, d : n]`, reduced over
# the width axis -- no gathers, no scatters, and the finished diagonal is one
# contiguous row. Check it on a filled chart (`foldax.layers.inside.inside_charts`):

# %%
demo = layers.encode_batch(["GGGGAAACCCCAGUCAGGAAACUG"], buckets=None)[0]
charts = layers.inside.inside_charts(params, demo)
F, Zn, Zr = charts["F"], charts["Zn"], charts["Zr"]
L = demo.shape[1]
for d in (5, 12, 20):
    left = F[:, 0:d, 0 : L - d]  # F[i][i+m],     m = 0..d-1 (m = 0: i unpaired)
    right = Zr[:, L - d + 1 : L + 1, d:L]  # Z[i+m+1][i+d], the same m
    zn = jax.nn.logsumexp(left + right, axis=1)  # reduce over split points, vectorised over i
    print(f"d={d:2d}: slices reproduce Zn[i][i+d] for all i:", bool(jnp.allclose(zn, Zn[:, d + 1, : L - d], atol=1e-5)))

# %% [markdown]
# ### (b) Static chunks hugging the triangle
#
# Slices need static shapes, but diagonal d needs a `d x (n-d)` block. foldax splits
# the diagonals into a few chunks `[d0, d1)` (chosen by a small DP,
# `foldax.layers.chart.diagonal_chunks`); a chunk uses `(d1-1) x (n-d0)` blocks, so its work
# follows the triangle instead of the naive `n x n` per diagonal. Uncomputed cells hold
# -inf / 0, so padding never contributes. Each chunk is one more `fori_loop` to
# compile: more chunks, less padding, longer compiles.

# %%
n, h = 200, 3
d = np.arange(n)
useful = np.maximum(d - h - 1, 0) * (n - d)  # real split terms of diagonal d
fig = Figure(figsize=(7, 3.8))
FigureCanvasAgg(fig)
ax = fig.add_subplot()
ax.plot(d, np.full(n, n * n), color="tab:red", label=f"naive: n x n = {n * n * n / 1e6:.1f}M terms")
for num in (3, 6, 12):
    chunks = layers.chart.diagonal_chunks(n, num)
    work = np.zeros(n)
    for d0, d1 in chunks:
        work[d0:d1] = max(d1 - 1, 1) * (n - d0)
    ax.step(d, work, where="post", label=f"foldax, {len(chunks)} chunks: {work.sum() / 1e6:.2f}M terms")
ax.fill_between(d, useful, color="0.8", label=f"useful: {useful.sum() / 1e6:.2f}M terms")
ax.set_xlabel("diagonal d = j - i")
ax.set_ylabel("split terms computed")
ax.set_title(f"bifurcation work per diagonal, n = {n}")
ax.set_ylim(0, 1.55 * n * n)
ax.legend(fontsize=8, ncol=2, loc="upper center")
fig

# %% [markdown]
# ### (c) In-place row updates and `lax.optimization_barrier`
#
# Each diagonal writes one row into each chart with `lax.dynamic_update_slice`, which
# XLA does in place inside the loop. But XLA likes to *fuse* the computation of the new
# row into that update; the fused update then reads the chart it writes, and XLA must
# copy the whole chart first -- every diagonal, O(n^3) memory traffic in all.
# `lax.optimization_barrier` on the new rows forces them to be materialised first,
# and the updates stay in place. To see it, compile the forward pass once more with
# the barrier replaced by the identity and count the full-chart `copy` instructions
# in the optimised HLO (`compiled.as_text()`; `XLA_FLAGS=--xla_dump_to=DIR` dumps
# every stage to files instead).

# %%
n = 200
x = sequences[n]
chart_copy = re.compile(rf"= f32\[1,{n + 1},{n + 1}\]\{{[0-9,]+\}} copy\(")
with_barrier = results["foldax", "forward", n]


class _NoBarrier(types.SimpleNamespace):
    """jax.lax, except optimization_barrier is the identity."""

    def __getattr__(self, name):
        return getattr(lax, name)


def _retrace():
    jax.clear_caches()  # re-trace log_partition's inner jit with the patched module
    layers.chart._programs.cache_clear()  # and the engine's per-geometry programs


layers.chart.lax = _NoBarrier(optimization_barrier=lambda values: values)
_retrace()
try:
    without_barrier = measure(foldax_fwd, params, x)
finally:
    layers.chart.lax = lax
    _retrace()

for name, r in (("with barrier", with_barrier), ("without barrier", without_barrier)):
    copies = len(chart_copy.findall(r["compiled"].as_text()))
    print(f"{name:<16}: {copies:2d} full-chart copies in the HLO, forward {r['run_ms']:.2f} ms")

# %% [markdown]
# ### (d) Batch-major layout
#
# Charts are `[B, width, position]`: the reductions run over the width axis and
# vectorise along positions, the minor (contiguous) axis. Batching a per-sequence
# engine with `vmap` would put the batch axis last instead -- for a single sequence a
# size-1 minor axis, and XLA's vectorised loops then run over nothing. A toy version of
# one chunk's split reduction, the same data in the two layouts:


# %%
def split_reduce(batch_minor, length=256):
    rows = length // 2

    def run(F, Z):
        def body(d, acc):
            if batch_minor:  # [width, position, batch]
                terms = F[:rows] + lax.dynamic_slice(Z, (d, d, 0), (rows, length, 1))
                return acc + jax.nn.logsumexp(terms, axis=0).sum()
            terms = F[:, :rows] + lax.dynamic_slice(Z, (0, d, d), (1, rows, length))  # [batch, width, position]
            return acc + jax.nn.logsumexp(terms, axis=1).sum()

        return lax.fori_loop(0, rows, body, 0.0)

    shape_f = (length, length, 1) if batch_minor else (1, length, length)
    shape_z = (length, 2 * length, 1) if batch_minor else (1, length, 2 * length)
    return measure(run, jnp.zeros(shape_f), jnp.zeros(shape_z))


major, minor = split_reduce(False), split_reduce(True)
print(f"batch-major [B, w, i]: {major['run_ms']:.2f} ms   batch-minor [w, i, B=1]: {minor['run_ms']:.2f} ms"
      f"   ({minor['run_ms'] / major['run_ms']:.1f}x slower)")

# %% [markdown]
# ### (e) The outside pass: `jax.vjp` of one diagonal, O(n^2) memory
#
# Reverse-mode autodiff of the scan stores every step's residuals -- here the
# `n x n` bifurcation terms of each of the n steps, O(n^3) memory. foldax keeps only
# the O(n^2) charts and runs the *outside algorithm* itself (`layers/chart.py`): the
# diagonals in reverse, each one `jax.vjp` of the grammar's per-diagonal step at the
# saved charts, its adjoints added back into adjoint charts. The semiring's sums hand
# out the shares (softmax for log Z, arg-max for the best structure, a sampled choice
# for exact samples), and because all of it is plain JAX, forward mode over it gives
# second derivatives in O(n^2) memory too. The gradient's temp memory from part 1:

# %%
for impl in ("naive", "foldax"):
    small, large = (results[impl, "gradient", n]["temp_mb"] for n in SIZES)
    print(f"{impl:<7} gradient temp memory: {small:7.2f} MB at n={SIZES[0]}, {large:7.2f} MB at n={SIZES[1]}"
          f"  (x{large / small:.1f} for 2x n; n^2 -> x4, n^3 -> x8)")

# %% [markdown]
# **Summary.** The layout turns the O(n^3) bifurcation into dense slice-add-reduce
# operations over a band that the chunks keep close to the real triangle; the barrier
# keeps the per-diagonal row writes in place; batch-major keeps the vector units busy;
# and the outside pass makes the gradient one more O(n^3)-time, O(n^2)-memory pass
# instead of a stored tape. `benchmarks/README.md` has the larger measurements
# (including a C++ baseline).

# %%
import shutil

shutil.rmtree(trace_dir, ignore_errors=True)
