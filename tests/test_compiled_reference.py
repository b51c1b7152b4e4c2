"""Compiled public functions against an independent float64 reference, at realistic sizes.

Issue 10: ``structure_score`` was wrong under ``jit`` for most inputs of length >= 33,
while every test at small ``n`` passed, because XLA:CPU miscompiled its loop with AVX2
code generation (see ``tests/test_xla_regression.py``). The code XLA emits depends on
the CPU's vector ISA, the optimisation level, the shapes and the number of devices. The rest
of the test session compiles with LLVM's optimisation off (``tests/compile_flags.py``), so
the checks here run in subprocesses with XLA's default optimisation, as users' programs compile,
and two CPU devices, where they also run with the batch sharded over both devices (automatic
and explicit meshes) and the training and evaluation steps get one row per device:

* with AVX2 code generation (``XLA_FLAGS=--xla_cpu_max_isa=AVX2
  --xla_force_host_platform_device_count=2``, on x86-64 CPUs that have it, AVX-512 ones
  included), every case;
* with the host's own code generation, where that is not AVX2 (the slow sweep's scoring and
  training-step cases, where issue 10's miscompile was).

The default run's cheapest case also runs in this process, under the session's flags.

The references share no code with the engine: a plain loop over the pairs
(:func:`foldax.layers.reference.structure_score_reference`), the grammar's recursion in float64
NumPy (:func:`reference_log_z`, checked here against the cell-by-cell loops of
:func:`foldax.layers.reference.reference_log_partition`) and the brute force over all structures.
Only public functions are called (``layers.*``, ``model.*``, ``train.*``).

The default run checks a few representative cases (``FAST``: all of them in the
AVX2 subprocess, the cheapest in this process); ``-m slow`` sweeps (``SLOW``: all of it in the
AVX2 subprocess, its scoring cases with the host's code generation) parameter
scales (std 0.1, 1, 2, 5), lengths 1..500 in several buckets, ``min_hairpin`` 0, 1, 3, 5,
float32 and float64, IUPAC letters, with and without ``phi``, ``[n]`` calls, plain ``jit``,
``vmap``, batches with mixed lengths, sharding and the training and evaluation steps.
Every check failed (under AVX2 code generation) before the fix of issue 10, except the
training step's loss and gradient, which XLA compiled right (the decoders' checks fail
through ``structure_score`` of the best structure).

Run a case set by hand: ``python tests/test_compiled_reference.py fast`` (or ``slow``; optionally
followed by the checks to run: ``scores``, ``steps``, ``decoders``), with the ``XLA_FLAGS`` to try.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (the worker subprocess)
    sys.path.insert(0, str(ROOT))

from compile_flags import default_code_generation_environ  # noqa: E402
from foldax import layers  # noqa: E402
from foldax.layers.dotbracket import pairs_from_table, validate_pair_table  # noqa: E402
from foldax.layers.reference import (  # noqa: E402
    brute_force_pair_probs,
    random_params,
    reference_log_partition,
    structure_score_reference,
)

# --------------------------------------------------------------------------- references


def reference_log_z(params, tokens, *, phi=None, min_hairpin=3, semiring="log"):
    """log Z (``"log"``) or the best score (``"max"``) by the grammar's recursion, float64 NumPy.

    The recursion of the README, one diagonal ``d = j - i`` at a time, vectorised over
    ``i`` (and over the split point ``k``)::

        P[i][j]  = pair[x_i,x_j] + phi[i][j] + (+)(stack[x_i,x_j,x_{j-1},x_{i+1}] + P[i+1][j-1],
                                                 loop + Zn[i+1][j-1])             (d > h)
        Zn[i][j] = (+)(unpaired[x_i] + Z[i+1][j], (+)_{k=i+h+1..j-1} P[i][k] + Z[k+1][j])
        Z[i][j]  = (+)(Zn[i][j], P[i][j])

    with ``(+)`` = log-add-exp or max; ``Z = Zn = 0`` and ``P = -inf`` on empty spans.
    """
    p = {k: np.asarray(params[k], np.float64) for k in ("stack", "pair", "unpaired", "loop")}
    x = np.asarray(tokens, np.int64)
    n, h = len(x), min_hairpin
    if n == 0:
        return 0.0
    phi = np.zeros((n, n)) if phi is None else np.asarray(phi, np.float64)
    plus = np.logaddexp if semiring == "log" else np.maximum
    total = np.logaddexp.reduce if semiring == "log" else np.max
    P = np.full((n + 1, n + 1), -np.inf)
    Zn = np.zeros((n + 1, n + 1))
    Z = np.zeros((n + 1, n + 1))
    for d in range(n):
        i = np.arange(n - d)
        j = i + d
        if d > h:
            inner_p = P[i + 1, j - 1] if d >= 2 else np.full(len(i), -np.inf)
            inner_zn = Zn[i + 1, j - 1] if d >= 2 else np.zeros(len(i))
            stack = p["stack"][x[i], x[j], x[j - 1], x[i + 1]]
            P[i, j] = p["pair"][x[i], x[j]] + phi[i, j] + plus(stack + inner_p, p["loop"] + inner_zn)
        k = i[:, None] + np.arange(h + 1, d)[None, :]
        split = P[i[:, None], k] + Z[k + 1, j[:, None]]
        unpaired = p["unpaired"][x[i]] + Z[i + 1, j]
        Zn[i, j] = total(np.concatenate([unpaired[:, None], split], axis=1), axis=1)
        Z[i, j] = plus(Zn[i, j], P[i, j])
    return float(Z[0, n - 1])


def reference_score(params, tokens, table, phi=None):
    """score(s) by the plain loop over pairs of :mod:`foldax.layers.reference` (float64)."""
    return structure_score_reference(params, np.asarray(tokens), pairs_from_table(np.asarray(table)), phi=phi)


# --------------------------------------------------------------------------- inputs

NUCLEOTIDES = "ACGU"
OTHER_LETTERS = "TNRYKMSWBDHVacgutn"  # T = U, IUPAC codes = N, lower case


def random_sequence(rng, n):
    """A string of length n: mostly A C G U, ~15% other accepted letters (IUPAC, T, lower case)."""
    letters = [
        OTHER_LETTERS[rng.integers(len(OTHER_LETTERS))] if rng.random() < 0.15 else NUCLEOTIDES[rng.integers(4)]
        for _ in range(n)
    ]
    return "".join(letters)


def random_structure(rng, n, min_hairpin):
    """A random nested pair table ``[n]`` made of helices (stacked pairs) and loops."""
    table = np.full(n, -1, np.int32)

    def fill(lo, hi):
        i = lo
        while i <= hi:
            if hi - i > min_hairpin and rng.random() < 0.3:
                j = int(rng.integers(i + min_hairpin + 1, hi + 1))
                a, b = i, j
                while True:
                    table[a], table[b] = b, a
                    if b - a - 2 > min_hairpin and rng.random() < 0.8:
                        a, b = a + 1, b - 1
                    else:
                        break
                fill(a + 1, b - 1)
                i = j + 1
            else:
                i += 1

    fill(0, n - 1)
    return table


@dataclasses.dataclass(frozen=True)
class Inputs:
    params: dict
    tokens: np.ndarray  # [B, L] int32 (garbage past each length)
    tables: np.ndarray  # [B, L] int32 (-1 past each length)
    lengths: np.ndarray  # [B] int32
    phi: np.ndarray | None  # [B, L, L] in the params' dtype, or None
    min_hairpin: int

    def row(self, b):
        """(tokens [n], table [n], phi [n, n] or None) of sequence b."""
        n = int(self.lengths[b])
        phi = None if self.phi is None else self.phi[b, :n, :n]
        return self.tokens[b, :n], self.tables[b, :n], phi


def make_inputs(case):
    rng = np.random.default_rng(case.seed)
    dtype = np.dtype(case.dtype)
    params = random_params(rng, case.scale, dtype)
    lengths = np.asarray(case.lengths, np.int32)
    batch = len(lengths)
    tokens = rng.integers(0, 5, (batch, case.L)).astype(np.int32)
    tables = np.full((batch, case.L), -1, np.int32)
    for b, n in enumerate(lengths):
        tokens[b, :n] = layers.encode(random_sequence(rng, n))
        tables[b, :n] = random_structure(rng, n, case.min_hairpin)
    phi = (case.scale * rng.normal(size=(batch, case.L, case.L))).astype(dtype) if case.phi else None
    return Inputs(params, tokens, tables, lengths, phi, case.min_hairpin)


# --------------------------------------------------------------------------- cases


ALL = ("batched", "jit", "vmap", "sharded", "single")


@dataclasses.dataclass(frozen=True)
class Case:
    """One input set and what to check on it (``variants``: see :func:`run_variants`)."""

    check: str  # "scores" | "steps" | "decoders" | "turner" (layers.turner2004 and ViennaRNA)
    lengths: tuple  # one per batch row (an even number of rows: sharding halves the batch)
    L: int  # padded length (a bucket)
    scale: float = 1.0  # std of the random params (and of phi)
    min_hairpin: int = 3
    phi: bool = False
    dtype: str = "float32"
    seed: int = 0
    single: tuple = ()  # the lengths of the rows that the "single" variant runs as [n] inputs
    variants: tuple = ALL  # of structure_score (cheap to compile)
    engine_variants: tuple = ("batched",)  # of the functions that compile the DP (~5-15 s each)
    log_prob: bool = True  # scores: also log_prob
    model: str = "stacking"  # steps: "stacking" | "neural"
    samples: int = 0  # decoders: exact samples per sequence to check (0: none); turner: sampled structures

    @property
    def id(self):
        parts = [self.check, f"L{self.L}", f"std{self.scale:g}", f"h{self.min_hairpin}", self.dtype]
        parts += ["phi"] if self.phi else []
        parts += [self.model] if self.check == "steps" else []
        return "-".join(parts)


FAST = [
    # Lengths 1..500 in one batch (with an empty row), and [n] calls: batch size 1 without phi
    # is what XLA miscompiled (most lengths >= 33).
    Case("scores", (500, 1, 0, 33, 257, 64), L=512, scale=2.0, single=(500, 33, 257, 64), log_prob=False),
    Case("scores", (64, 40), L=64, scale=5.0, min_hairpin=0, seed=1, single=(64,),
         variants=("batched", "sharded", "single"), engine_variants=("batched", "sharded", "single")),
    # Two rows: one per device in the 2-device run (a batch of 1 per device).
    Case("steps", (64, 47), L=64, scale=1.0, seed=2),
    Case("decoders", (40, 33), L=40, scale=2.0, min_hairpin=1, seed=3, single=(40,)),
]
#: The default run's in-process part (the compiled engine is what costs: ~5 s per program).
FAST_IN_PROCESS = FAST[:1]

SLOW = [
    Case("scores", lengths, L=L, scale=scale, min_hairpin=h, phi=phi, dtype=dtype, seed=seed,
         single=(lengths[0], lengths[-1]), engine_variants=engine)
    for seed, (lengths, L, scale, h, phi, dtype, engine) in enumerate([
        ((32, 31, 2, 17), 32, 0.1, 0, False, "float32", ALL),
        ((64, 40, 33, 1), 64, 1.0, 1, True, "float64", ALL),
        ((128, 100, 65, 120), 128, 2.0, 3, False, "float32", ALL),
        ((192, 129, 150, 0), 192, 5.0, 5, True, "float32", ("batched", "sharded")),
        ((256, 200, 33, 255), 256, 0.1, 3, True, "float64", ("batched", "sharded")),
        ((500, 499, 3, 120), 512, 5.0, 3, True, "float64", ("batched",)),
    ])
] + [
    Case("steps", lengths, L=L, scale=scale, min_hairpin=h, model=model, seed=100 + seed)
    for seed, (lengths, L, scale, h, model) in enumerate([
        ((128, 70), 128, 0.1, 0, "stacking"),
        ((96, 90, 64, 5), 96, 2.0, 1, "neural"),
    ])
] + [
    Case("decoders", lengths, L=L, scale=scale, min_hairpin=h, phi=phi, dtype=dtype, seed=200 + seed,
         single=(lengths[0],), engine_variants=engine, samples=samples)
    for seed, (lengths, L, scale, h, phi, dtype, engine, samples) in enumerate([
        ((12, 9, 11, 1), 12, 1.0, 0, True, "float64", ("batched", "jit", "vmap", "sharded"), 2000),
        ((64, 50, 33, 5), 64, 0.1, 3, False, "float32", ("batched", "sharded"), 300),
        ((128, 97, 128, 60), 128, 5.0, 5, True, "float64", ("batched",), 0),
        ((500, 333), 512, 2.0, 3, False, "float32", ("batched",), 0),
    ])
] + [
    # Turner 2004 energies (sampled structures; each program compiles for ~10-40 s).
    Case("turner", (128, 76), L=128, seed=300, single=(128, 76), variants=("batched", "sharded", "single"),
         samples=1),
]

# --------------------------------------------------------------------------- checks


def _tolerance(inputs, scale_of_values):
    """Absolute tolerance: float32 rounding of sums of O(n) terms of size ~std."""
    rtol = 1e-10 if inputs.params["loop"].dtype == np.float64 else 1e-5
    return rtol * (1.0 + scale_of_values)


def _assert_close(name, got, expected, atol):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    bad = np.flatnonzero(~(np.abs(got - expected) <= atol))
    assert not bad.size, (
        f"{name}: {bad.size} of {got.size} wrong (tolerance {np.max(atol):.3g}), e.g. index {bad[0]}: "
        f"{got.ravel()[bad[0]]!r} != {expected.ravel()[bad[0]]!r}"
    )


def _meshes():
    """(name, mesh) for the sharded variants: 2 devices, automatic and explicit axes."""
    if jax.device_count() < 2:
        return []
    AxisType = jax.sharding.AxisType
    return [(f"sharded-{t.name.lower()}", jax.make_mesh((2,), ("data",), axis_types=(t,)))
            for t in (AxisType.Auto, AxisType.Explicit)]


def _put(mesh, *arrays):
    spec = jax.sharding.PartitionSpec("data")
    return [None if a is None else jax.device_put(jnp.asarray(a), jax.sharding.NamedSharding(mesh, spec))
            for a in arrays]


def run_variants(fn, inputs, variants, single=()):
    """``{variant: result}`` of ``fn(params, tokens, tables, lengths, phi)`` (batched inputs).

    batched: the call as is; jit: the whole call under ``jax.jit``; vmap: ``jax.vmap``
    over two halves of the batch; single: ``fn`` on ``[n]`` inputs (one row at a time,
    the rows whose length is in ``single``); sharded: the batch sharded over 2 devices
    (when there are 2), on an automatic and on an explicit mesh.
    Every result is batch-major ([B, ...]) or, for single, a dict row -> result.
    """
    p, x, t, n, f = inputs.params, inputs.tokens, inputs.tables, inputs.lengths, inputs.phi
    out = {}
    if "batched" in variants:
        out["batched"] = fn(p, x, t, n, f)
    if "jit" in variants:
        as_array = lambda a: None if a is None else jnp.asarray(a)
        out["jit"] = jax.jit(fn)(p, *map(as_array, (x, t, n, f)))
    if "vmap" in variants:
        halves = lambda a: None if a is None else jnp.asarray(a).reshape((2, -1) + a.shape[1:])
        in_axes = (None, 0, 0, 0, None if f is None else 0)
        res = jax.vmap(fn, in_axes=in_axes)(p, *map(halves, (x, t, n, f)))
        out["vmap"] = jax.tree.map(lambda r: r.reshape((-1,) + r.shape[2:]), res)
    rows = [b for b, length in enumerate(n) if int(length) in single] if "single" in variants else []
    if rows:
        out["single"] = {}
        for b in rows:
            xb, tb, fb = inputs.row(b)
            out["single"][b] = fn(p, xb, tb, None, fb)
    for name, mesh in _meshes() if "sharded" in variants else ():
        with jax.set_mesh(mesh):
            out[name] = fn(p, *_put(mesh, x, t, n, f))
    return out


def _per_row(results, expected, name, atol):
    """Compares every variant of a [B] result (and single-row results) with ``expected`` [B]."""
    for variant, got in results.items():
        if variant == "single":
            for b, value in got.items():
                _assert_close(f"{name} [{variant} row {b}]", value, expected[b], atol[b])
        else:
            _assert_close(f"{name} [{variant}]", got, expected, atol)


def check_scores(case):
    """structure_score and log_prob against the loop over pairs and the float64 recursion."""
    inputs = make_inputs(case)
    h = case.min_hairpin
    rows = [inputs.row(b) for b in range(len(inputs.lengths))]
    expected = np.array([reference_score(inputs.params, x, t, phi) for x, t, phi in rows])
    size = np.array([len(x) * case.scale * (5 if case.phi else 4) for x, _, _ in rows]) + np.abs(expected)
    atol = _tolerance(inputs, size)

    def score(p, x, t, n, f):
        return layers.structure_score(p, x, t, n, phi=f, min_hairpin=h)

    _per_row(run_variants(score, inputs, case.variants, case.single), expected, "structure_score", atol)
    if not case.log_prob:
        return
    log_z = np.array([reference_log_z(inputs.params, x, phi=phi, min_hairpin=h) for x, _, phi in rows])

    def log_prob(p, x, t, n, f):
        return layers.log_prob(p, x, t, n, phi=f, min_hairpin=h)

    atol = _tolerance(inputs, size + np.abs(log_z))
    _per_row(run_variants(log_prob, inputs, case.engine_variants, case.single), expected - log_z, "log_prob", atol)


def _make_model(case, inputs):
    from flax import nnx

    from foldax.model import NeuralPhiModel, StackingModel

    common = dict(params=inputs.params, min_hairpin=case.min_hairpin, num_chunks=None)
    if case.model == "stacking":
        return StackingModel(**common)
    model = NeuralPhiModel(rngs=nnx.Rngs(case.seed), **common)
    # The pair head starts at zero (phi = 0): give it weights so that phi matters.
    kernel = model.encoder.right.kernel
    kernel[...] = case.scale * jax.random.normal(jax.random.key(case.seed), kernel.shape, kernel.dtype)
    return model


def check_steps(case):
    """The training step's CLL loss and gradient, and the eval step's log-likelihood, on a mesh of every device.

    The training step runs plain SGD with learning rate ``LR`` and no clipping, so the update
    it makes is ``-LR`` times the loss gradient: its projection on a random direction is
    checked against central differences of the float64 reference.
    """
    from flax import nnx

    from foldax.configs import default
    from foldax.train.train import create_optimizer, make_eval_step, make_mesh, make_train_step, replicate, to_global_batch

    inputs = make_inputs(case)
    model = _make_model(case, inputs)
    weights = (inputs.lengths > 0).astype(np.float32)  # the empty row is padding
    batch = {"tokens": inputs.tokens, "lengths": inputs.lengths, "pair_table": inputs.tables, "weights": weights}
    _, phi = model.scores(jnp.asarray(inputs.tokens), jnp.asarray(inputs.lengths))  # the model's own phi
    phi = None if phi is None else np.asarray(phi, np.float64)
    h = case.min_hairpin

    def reference_nll_sum(params):
        total = 0.0
        for b, n in enumerate(inputs.lengths):
            x, t = inputs.tokens[b, :n], inputs.tables[b, :n]
            f = None if phi is None else phi[b, :n, :n]
            nll = reference_log_z(params, x, phi=f, min_hairpin=h) - reference_score(params, x, t, f)
            total += float(weights[b]) * nll
        return total

    n_tokens = float(np.sum(weights * inputs.lengths))
    nll = reference_nll_sum(inputs.params) / n_tokens
    atol = 1e-5 * (1.0 + abs(nll)) * max(1.0, case.scale)

    lr = 100.0
    config = default.get_config()
    config.optimizer.update(name="sgd", momentum=0.0, learning_rate=lr, schedule="constant", warmup_steps=0,
                            grad_clip=0.0, l2=0.0)
    config.decoders = ()  # the log-likelihood only; the decoders are checked in check_decoders
    tx, schedule = create_optimizer(config, 10)
    graphdef, host_state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
    mesh = make_mesh()
    with jax.set_mesh(mesh):  # as train.train_and_evaluate runs them
        sums = make_eval_step(graphdef, config)(replicate(host_state, mesh), to_global_batch(batch, mesh))
        new_state, metrics = make_train_step(graphdef, config, schedule, mesh)(
            replicate(host_state, mesh), to_global_batch(batch, mesh))
    _assert_close("eval step ll_sum / n_tokens", float(sums["ll_sum"]) / float(sums["n_tokens"]), -nll, atol)
    _assert_close("eval step n_tokens", sums["n_tokens"], n_tokens, 0)
    _assert_close("train step nll_per_nt", metrics["nll_per_nt"], nll, atol)
    _assert_close("train step loss", metrics["loss"], nll, atol)
    _assert_close("train step n_invalid", metrics["n_invalid"], 0, 0)

    new_params = nnx.merge(graphdef, jax.device_get(new_state))[0].inside.params_dict()
    rng = np.random.default_rng(case.seed)
    direction = {k: rng.normal(size=np.shape(v)) for k, v in inputs.params.items()}
    slope = sum(np.vdot(np.asarray(inputs.params[k], np.float64) - np.asarray(new_params[k], np.float64),
                        direction[k]) for k in direction) / lr
    eps = 1e-4
    shifted = lambda s: {k: np.asarray(v, np.float64) + s * eps * direction[k] for k, v in inputs.params.items()}
    expected = (reference_nll_sum(shifted(1)) - reference_nll_sum(shifted(-1))) / (2 * eps * n_tokens)
    _assert_close("train step gradient . v", slope, expected, 1e-4 * (1.0 + abs(expected)))


def _mea_objective(probs, table, gamma):
    """SUM_{(i,j) in s} 2 gamma P_ij + SUM_{i unpaired} (1 - SUM_j P_ij), float64."""
    q = 1 - probs.sum(axis=1)
    pairs = pairs_from_table(table)
    paired = np.zeros(len(q), bool)
    for i, j in pairs:
        paired[[i, j]] = True
    return sum(2 * gamma * probs[i, j] for i, j in pairs) + q[~paired].sum()


def _shifted(params, name, delta):
    out = {k: np.asarray(v, np.float64) for k, v in params.items()}
    out[name] = out[name] + delta
    return out


def check_decoders(case):
    """max_score, best_structure, pair_probs, mea_structure and sample_structures vs float64 references."""
    inputs = make_inputs(case)
    h, p = case.min_hairpin, inputs.params
    rows = [inputs.row(b) for b in range(len(inputs.lengths))]
    kw = dict(min_hairpin=h)
    best_ref = np.array([reference_log_z(p, x, phi=f, min_hairpin=h, semiring="max") for x, _, f in rows])
    log_z = np.array([reference_log_z(p, x, phi=f, min_hairpin=h) for x, _, f in rows])
    size = np.array([len(x) * case.scale * (5 if case.phi else 4) for x, _, _ in rows]) + np.abs(best_ref)
    atol = _tolerance(inputs, size + np.abs(log_z))

    # max_score, and the best structure: valid, and its score (compiled and reference) = max_score.
    _per_row(run_variants(lambda p, x, t, n, f: layers.max_score(p, x, n, phi=f, **kw), inputs, case.engine_variants),
             best_ref, "max_score", atol)
    for variant, tables in run_variants(lambda p, x, t, n, f: layers.best_structure(p, x, n, phi=f, **kw),
                                        inputs, case.engine_variants).items():
        tables = np.asarray(tables)
        for b, (x, _, f) in enumerate(rows):
            n = len(x)
            validate_pair_table(tables[b, :n], min_hairpin=h)
            assert np.all(tables[b, n:] == -1), f"best_structure [{variant}] row {b}: padding not -1"
            _assert_close(f"reference score of best_structure [{variant}] row {b}",
                          reference_score(p, x, tables[b, :n], f), best_ref[b], atol[b])
        compiled = layers.structure_score(p, inputs.tokens, tables, inputs.lengths, phi=inputs.phi, **kw)
        _assert_close(f"structure_score(best_structure) [{variant}]", compiled,
                      layers.max_score(p, inputs.tokens, inputs.lengths, phi=inputs.phi, **kw), atol)
        for b, (x, _, f) in enumerate(rows):
            if variant == "batched" and len(x) in case.single:  # one structure ([n] inputs)
                _assert_close(f"structure_score(best_structure) [single row {b}]",
                              layers.structure_score(p, x, tables[b, : len(x)], phi=f, **kw), best_ref[b], atol[b])

    # pair_probs: brute force where feasible; everywhere, the expected numbers of pairs and of
    # unpaired bases (SUM P, n - 2 SUM P) against d log Z / d(pair, unpaired shift) of the
    # reference, and single pairs: P_ij = 1 - Z(without (i, j)) / Z.
    prob_tol = 1e-9 if inputs.params["loop"].dtype == np.float64 else 2e-4
    for variant, probs in run_variants(lambda p, x, t, n, f: layers.pair_probs(p, x, n, phi=f, **kw),
                                       inputs, case.engine_variants).items():
        probs = np.asarray(probs, np.float64)
        for b, (x, _, f) in enumerate(rows):
            n, P = len(x), probs[b]
            name = f"pair_probs [{variant}] row {b}"
            _assert_close(f"{name} symmetric", P, P.T, 0)
            assert np.all(P[n:] == 0) and np.all(P[:, n:] == 0), f"{name}: padding not 0"
            assert np.all(P >= -prob_tol) and np.all(P.sum(axis=1) <= 1 + prob_tol), f"{name}: not probabilities"
            P = P[:n, :n]
            if n <= 12:
                _assert_close(name, P, brute_force_pair_probs(p, x, phi=f, min_hairpin=h), prob_tol)
                continue
            eps = 1e-5
            for param, count in (("pair", P.sum() / 2), ("unpaired", n - P.sum())):
                up, down = (reference_log_z(_shifted(p, param, s * eps), x, phi=f, min_hairpin=h) for s in (1, -1))
                _assert_close(f"{name}: expected number of {param} terms", count, (up - down) / (2 * eps),
                              prob_tol * n + 1e-6 * n)
            i, j = np.unravel_index(np.argmax(np.triu(P)), P.shape)
            without = np.zeros((n, n)) if f is None else np.array(f, np.float64)
            without[i, j] = -np.inf
            expected = -np.expm1(reference_log_z(p, x, phi=without, min_hairpin=h) - log_z[b])
            _assert_close(f"{name}: P[{i}, {j}]", P[i, j], expected, prob_tol)
        if variant != "batched":
            continue
        # mea_structure on these probabilities: its objective is the optimum (max semiring reference).
        gamma = 1.5
        mea = np.asarray(layers.mea_structure(probs, inputs.lengths, gamma=gamma, **kw))
        for b, (x, _, f) in enumerate(rows):
            n, P = len(x), probs[b, : len(x), : len(x)]
            validate_pair_table(mea[b, :n], min_hairpin=h)
            q = 1 - P.sum(axis=1)
            zero = {k: np.zeros_like(np.asarray(v, np.float64)) for k, v in p.items()}
            optimum = reference_log_z(zero, np.zeros(n, np.int32), phi=2 * gamma * P - q[:, None] - q[None, :],
                                      min_hairpin=h, semiring="max") + q.sum()
            _assert_close(f"MEA objective row {b}", _mea_objective(P, mea[b, :n], gamma), optimum, 1e-4 + prob_tol * n)
        if case.samples:
            check_samples(case, inputs, probs)


def check_samples(case, inputs, probs):
    """Exact samples: valid structures whose pair frequencies match pair_probs (within 5 sigma + 3/S)."""
    num = case.samples
    tables = np.asarray(layers.sample_structures(jax.random.key(case.seed), inputs.params, inputs.tokens, num,
                                                 inputs.lengths, phi=inputs.phi, min_hairpin=case.min_hairpin))
    assert tables.shape == (len(inputs.lengths), num, case.L)
    for b, n in enumerate(inputs.lengths):
        freq = np.zeros((n, n))
        for s in range(num):
            validate_pair_table(tables[b, s, :n], min_hairpin=case.min_hairpin)
            assert np.all(tables[b, s, n:] == -1)
            i = np.flatnonzero(tables[b, s, :n] >= 0)
            freq[i, tables[b, s, i]] += 1
        freq /= num
        P = probs[b, :n, :n]
        bound = 5 * np.sqrt(P * (1 - P) / num) + 3 / num
        worst = np.unravel_index(np.argmax(np.abs(freq - P) - bound), P.shape)
        assert np.all(np.abs(freq - P) <= bound), f"samples row {b}: pair {worst}: {freq[worst]} vs P {P[worst]}"


def check_turner(case):
    """Turner 2004 parameters: structure_score, free_energy, max_score, best_structure and
    log_partition against ViennaRNA (MFE, partition function, eval of sampled structures)."""
    import RNA  # the test extra viennarna

    params = layers.turner2004(np.dtype(case.dtype))
    rng = np.random.default_rng(case.seed)
    RNA.init_rand(case.seed)
    md = RNA.md()
    md.uniq_ML, md.pf_smooth = 1, 0  # sampling; no smoothing (as layers.ensemble_free_energy)
    seqs = ["".join(rng.choice(list(NUCLEOTIDES), n)) for n in case.lengths]
    mfe, log_z, structures = [], [], []
    for seq in seqs:
        fc = RNA.fold_compound(seq, md)
        db, energy = fc.mfe()
        fc.exp_params_rescale(energy)
        _, ensemble = fc.pf()
        mfe.append(energy)
        log_z.append(-ensemble / layers.KT)
        structures.append(fc.pbacktrack() if case.samples else db)
    expected = np.array([-RNA.fold_compound(seq, md).eval_structure(db) / layers.KT
                         for seq, db in zip(seqs, structures)])
    tokens, lengths = layers.encode_batch(seqs, buckets=(case.L,))
    tables = np.full(tokens.shape, -1, np.int32)
    for b, db in enumerate(structures):
        tables[b, : len(db)] = layers.from_dot_bracket(db)
    inputs = Inputs(params, np.asarray(tokens), tables, np.asarray(lengths), None, case.min_hairpin)
    atol = 1e-5 * (1.0 + np.abs(expected)) + 1e-4

    def score(p, x, t, n, f):
        return layers.structure_score(p, x, t, n, min_hairpin=case.min_hairpin)

    _per_row(run_variants(score, inputs, case.variants, case.single), expected, "Turner structure_score", atol)
    energies = layers.free_energy(params, inputs.tokens, tables, inputs.lengths)
    _assert_close("free_energy", np.asarray(energies) / -layers.KT, expected, atol)
    for b in range(len(seqs)):
        x, t, _ = inputs.row(b)
        _assert_close(f"free_energy [single row {b}]", layers.free_energy(params, x, t) / -layers.KT, expected[b],
                      atol[b])
    kw = dict(min_hairpin=case.min_hairpin)
    best_ref = -np.array(mfe) / layers.KT
    atol = 1e-5 * (1.0 + np.abs(np.array(log_z))) + 1e-3
    _assert_close("Turner max_score", layers.max_score(params, inputs.tokens, inputs.lengths, **kw), best_ref, atol)
    best = np.asarray(layers.best_structure(params, inputs.tokens, inputs.lengths, **kw))
    _assert_close("free_energy(best_structure)", layers.free_energy(params, inputs.tokens, best, inputs.lengths),
                  mfe, 1e-3)
    _assert_close("Turner log_partition", layers.log_partition(params, inputs.tokens, inputs.lengths, **kw), log_z,
                  atol)


CHECKS = {"scores": check_scores, "steps": check_steps, "decoders": check_decoders, "turner": check_turner}


def run_case(case):
    CHECKS[case.check](case)


# --------------------------------------------------------------------------- tests


def test_reference_log_z_matches_the_cell_by_cell_loops():
    """The vectorised float64 reference is the grammar of layers.reference (both semirings, phi, h)."""
    rng = np.random.default_rng(0)
    for trial in range(24):
        n, h = int(rng.integers(0, 26)), int(rng.choice([0, 1, 3, 5]))
        params = random_params(rng, float(rng.choice([0.1, 1.0, 5.0])))
        x = rng.integers(0, 5, n)
        phi = rng.normal(size=(n, n)) if trial % 2 else None
        for semiring in ("log", "max"):
            expected = reference_log_partition(params, x, phi=phi, min_hairpin=h, semiring=semiring)
            assert reference_log_z(params, x, phi=phi, min_hairpin=h, semiring=semiring) == pytest.approx(
                expected, rel=1e-12, abs=1e-12)


def test_random_structures_are_valid_and_stack():
    rng = np.random.default_rng(1)
    stacked = 0
    for n, h in [(1, 0), (500, 0), (300, 5), (40, 3)]:
        table = random_structure(rng, n, h)
        validate_pair_table(table, min_hairpin=h)
        stacked += sum(1 for i, j in pairs_from_table(table) if table[i + 1] == j - 1)
    assert stacked > 50


@pytest.mark.parametrize("case", FAST_IN_PROCESS, ids=[c.id for c in FAST_IN_PROCESS])
def test_compiled_matches_reference(case):
    run_case(case)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1] for line in f if line.startswith("flags")), "")
        return frozenset(flags.split())
    except OSError:
        return frozenset()


def _has_avx2() -> bool:
    return "avx2" in _cpu_flags()


def _host_code_is_avx2() -> bool:
    """The host's own vector ISA is AVX2 (no AVX-512): its code generation is the AVX2 subprocess's."""
    return _has_avx2() and not any(flag.startswith("avx512") for flag in _cpu_flags())


def _run_worker(case_set, *checks, avx2=True):
    """Runs ``case_set`` (only ``checks``, if given) in a subprocess with XLA's default optimisation,
    two CPU devices and AVX2 code generation (where the CPU has it; ``avx2=False``: the host's own)."""
    isa = "--xla_cpu_max_isa=AVX2" if avx2 and _has_avx2() else ""
    env = default_code_generation_environ(isa, "--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, __file__, case_set, *checks], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith("OK"), proc.stdout[-3000:]


def test_compiled_matches_reference_avx2_two_devices():
    _run_worker("fast")


@pytest.mark.slow
def test_compiled_matches_reference_sweep_avx2_two_devices():
    _run_worker("slow")


@pytest.mark.slow
@pytest.mark.skipif(_host_code_is_avx2(), reason="this CPU's own code generation is AVX2: the AVX2 sweep "
                    "(test_compiled_matches_reference_sweep_avx2_two_devices) runs these cases with it")
def test_compiled_matches_reference_sweep_host_code_two_devices():
    # The scoring checks (structure_score, log_prob, the training and evaluation steps), where issue
    # 10's miscompile was.
    _run_worker("slow", "scores", "steps", avx2=False)


def main(case_set, *checks):
    jax.config.update("jax_enable_x64", True)  # as in the test session (tests/conftest.py)
    cases = [c for c in {"fast": FAST, "slow": SLOW}[case_set] if not checks or c.check in checks]
    failures = 0
    for case in cases:
        try:
            start = time.perf_counter()
            if case.check == "turner" and importlib.util.find_spec("RNA") is None:
                print(f"skipped {case.id} (ViennaRNA is not installed)", flush=True)
                continue
            run_case(case)
            print(f"ok      {case.id} ({time.perf_counter() - start:.1f} s)", flush=True)
        except Exception:  # report every case, then fail
            failures += 1
            print(f"FAILED  {case.id}\n{traceback.format_exc()}", flush=True)
    print(f"{len(cases) - failures} of {len(cases)} cases passed on {jax.device_count()} device(s)")
    print("OK" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*(sys.argv[1:] or ["fast"])))
