"""The XLA flags of the test session, and the code generation that users get.

Most of the suite's time is XLA compiling, most of that in LLVM's optimisation passes. The test
session (``tests/conftest.py``) therefore compiles with LLVM's optimisation off
(:data:`FAST_COMPILE`), and the processes it starts inherit that through ``XLA_FLAGS``. It changes
the machine code, not the program: XLA's HLO passes, fusion and buffer assignment are the same, and
the values agree to rounding (Turner ``log_partition`` of two sequences bit for bit, their
``pair_probs`` within 6e-8 in float32 and 4e-17 in float64).
Measured side by side on 2026-12-07 (2-core AMD EPYC, AVX2): a Turner NNX-layer test 61 s against
95 s (81 s of CPU against 144), tests/test_traceback.py's fast tests 72 s against 100 s, and the
2,000-nt Turner test, which mostly runs rather than compiles, 128 s against 119 s. The cost is in
programs of many small loop steps: sampling 1,000 Turner structures of two sequences by traceback
ran 173 s against 33 s, so tests that draw many samples at realistic lengths start a process without
the flag. The whole suite from a fresh clone (`.ci/run`) took 63 minutes against CI's 79 that day.

The code users run is compiled with XLA's default optimisation, and an optimising compiler can get
it wrong (issue 10, tests/test_xla_regression.py). The tests whose subject is that code run it in
subprocesses without :data:`FAST_COMPILE` (:func:`default_code_generation`): the sweep of
tests/test_compiled_reference.py (scoring, training and evaluation steps, decoders and the Turner
grammar against independent references), tests/test_xla_regression.py and the realistic-length
check of tests/test_traceback.py.
``FOLDAX_TEST_DEFAULT_CODEGEN=1`` runs the whole session with XLA's default optimisation.
"""

from __future__ import annotations

import os

#: LLVM at -O0 for the programs the test session compiles.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def session_flags(xla_flags: str, *, environ=os.environ) -> str:
    """``xla_flags`` with :data:`FAST_COMPILE` added, unless ``FOLDAX_TEST_DEFAULT_CODEGEN=1`` or the
    flags already choose an optimisation level."""
    if environ.get("FOLDAX_TEST_DEFAULT_CODEGEN", "") == "1" or "--xla_backend_optimization_level" in xla_flags:
        return xla_flags
    return f"{xla_flags} {FAST_COMPILE}".strip()


def default_code_generation(xla_flags: str) -> str:
    """``xla_flags`` without :data:`FAST_COMPILE`: a process started with them compiles as users' do."""
    return " ".join(flag for flag in xla_flags.split() if flag != FAST_COMPILE)


def replace_flags(xla_flags: str, *flags: str) -> str:
    """``xla_flags`` with ``flags`` in place of its flags of the same names (empty ones ignored)."""
    flags = [flag for flag in flags if flag]
    names = {flag.split("=", 1)[0] for flag in flags}
    return " ".join([*(flag for flag in xla_flags.split() if flag.split("=", 1)[0] not in names), *flags])


def default_code_generation_environ(*flags: str) -> dict:
    """The environment of a CPU-only process that compiles as users' programs do, with ``flags``
    (e.g. the ISA or the device count) in place of the session's flags of the same names."""
    xla_flags = replace_flags(default_code_generation(os.environ.get("XLA_FLAGS", "")), *flags)
    return dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")


def with_devices(count: int, xla_flags: str | None = None) -> str:
    """The session's ``XLA_FLAGS`` (or ``xla_flags``) for a process with ``count`` CPU devices."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    return replace_flags(flags, f"--xla_force_host_platform_device_count={count}")
