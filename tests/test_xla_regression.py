"""An XLA:CPU miscompilation that made ``layers.structure_score`` wrong (issue 10), in plain JAX.

With AVX2 code generation (``--xla_cpu_max_isa=AVX2``, or any x86 CPU with AVX2 but
without AVX-512), jaxlib 0.12.0 and 0.12.0.1 compute ``f`` below wrongly under ``jax.jit``
for batch size 1 and length >= 33: XLA fuses the shifted copy ``pt[:, 1:]`` with the
gathers into one loop, and LLVM's loop vectorizer turns the 8-lane load of ``pt[i + 1]``
into one element broadcast to all lanes (a first-order recurrence narrowed to a scalar).
jaxlib 0.11.1 and 0.11.2 miscompile foldax's old scoring loop the same way (this exact
function happens to compile right there); 0.7.0 - 0.11.0 were right in every check.
``XLA_FLAGS=--xla_backend_optimization_level=1`` (or 0) avoids it, at the cost of slower
code. foldax's scoring no longer builds such a loop (see ``layers/structure.py``); this
test pins the compiler bug itself, so that a jaxlib that fixes it is noticed (the strict
``xfail`` turns into a failure) and the workaround notes can be revisited.

The check runs in a subprocess so that ``XLA_FLAGS`` can select AVX2 code generation,
which the bug needs, on any x86-64 CPU that has AVX2 (AVX-512 CPUs included). LLVM also tunes
for the CPU it runs on: on an AMD EPYC (Zen 3, AVX2 only; 2026-12-06) the same jaxlib compiled
``f`` right, with or without the flag, so the strict ``xfail`` pins the bug on Intel CPUs, where
it was seen, and the check is skipped on others.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import jaxlib
import pytest

from compile_flags import default_code_generation_environ

REPRO = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np

    pair = jnp.full((5, 5), -6.0).at[2, 1].set(-1.0)

    def f(pair, loop, x, pt):
        batch, length = x.shape
        idx = jnp.arange(length)
        x_j = jnp.take_along_axis(x, jnp.clip(pt, 0, length - 1), axis=1)
        opens = pt > idx
        pt_next = jnp.concatenate([pt[:, 1:], jnp.full((batch, 1), -1, pt.dtype)], axis=1)
        inner = jnp.where(opens & (pt_next == pt - 1), 1.0, loop)
        return jnp.sum(jnp.where(opens, pair[x, x_j] + inner, 0), axis=1)

    for L in [32, 33, 64]:
        x = np.zeros((1, L), np.int32); x[0, :2] = 2; x[0, -2] = 1
        t = np.full((1, L), -1, np.int32); t[0, 1] = L - 2; t[0, L - 2] = 1
        print(L, float(f(pair, -3.0, x, t)[0]), float(jax.jit(f)(pair, -3.0, x, t)[0]))
    """
)


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


def _jaxlib_version() -> tuple:
    return tuple(int(p) for p in jaxlib.__version__.split(".")[:3] if p.isdigit())


def _run(script: str, xla_flags: str) -> subprocess.CompletedProcess:
    # XLA's default optimisation, not the test session's (tests/compile_flags.py): the bug is LLVM's.
    env = default_code_generation_environ(xla_flags)
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


needs_avx2 = pytest.mark.skipif(not _has_avx2(), reason="the bug needs AVX2 code generation (an x86-64 CPU with AVX2)")


@needs_avx2
@pytest.mark.skipif(_cpu_vendor() != "GenuineIntel",
                    reason="the miscompilation was seen on Intel CPUs; an AMD EPYC (Zen 3) compiled it right")
@pytest.mark.xfail(
    _jaxlib_version() >= (0, 12, 0),
    strict=True,
    reason="XLA:CPU/LLVM miscompiles a fused gather + shifted-copy loop with AVX2 code generation "
    "(jaxlib 0.12.0 - 0.12.0.1; length >= 33, batch 1). If this passes, the jaxlib in use fixed it: "
    "revisit the notes in layers/structure.py and tests/test_xla_regression.py.",
)
def test_plain_jax_gather_select_fusion_under_avx2():
    proc = _run(REPRO, "--xla_cpu_max_isa=AVX2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.split("\n"):
        if line.strip():
            length, eager, jitted = line.split()
            assert float(jitted) == float(eager) == -4.0, f"length {length}: jit {jitted} vs eager {eager}"


@needs_avx2
def test_workaround_flag_avoids_the_miscompilation():
    """The documented workaround: LLVM at optimization level 1 compiles the same program right."""
    proc = _run(REPRO, "--xla_cpu_max_isa=AVX2 --xla_backend_optimization_level=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.split("\n") if line.strip()]
    assert len(rows) == 3 and all(float(eager) == float(jitted) == -4.0 for _, eager, jitted in rows), proc.stdout


ISSUE_10 = textwrap.dedent(
    """
    import jax
    from foldax import layers
    from foldax.layers.dotbracket import from_dot_bracket
    from foldax.layers.reference import structure_score_reference
    from foldax.layers.dotbracket import pairs_from_table
    seq = "CCUGGGGUUAAGUAGUUUAGUCACAAUGUUUCCGCUAUGCGCUUCCAGGUUUUUAACCUUCGGUACGCUUUCUAGCAGUUAUUCAUUCAACUCAGGAG"
    db  = "(((....)))..((((.(((.((((...))))((((((.(((((((...)))))((((((((.(((...))))))).)))))))))))).))).))))"
    params = layers.init_params(jax.random.key(2), scale=2.0)
    table = from_dot_bracket(db)
    print(float(layers.structure_score(params, layers.encode(seq), table)),
          structure_score_reference(params, layers.encode(seq), pairs_from_table(table)))
    """
)


@needs_avx2
def test_issue_10_example_is_right_under_avx2():
    """foldax's own scoring, on the example of issue 10, under the code generation that broke it."""
    proc = _run(ISSUE_10, "--xla_cpu_max_isa=AVX2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, expected = map(float, proc.stdout.split())
    assert abs(expected - 97.964) < 1e-3  # the value worked out by hand in the issue
    assert got == pytest.approx(expected, rel=1e-6)
