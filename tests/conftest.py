"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly), XLA compiling
without LLVM's optimisation, one persistent compilation cache for the test session, and compiled
programs released between test files.

* The session and the processes it starts compile with ``--xla_backend_optimization_level=0``
  (``tests/compile_flags.py``: why, what it saves, and which tests compile as users' code does).
* One JAX persistent compilation cache for the whole test session, in a temporary folder
  (``FOLDAX_TEST_JAX_CACHE``: made by the session's first process, pytest or pytest-xdist's
  controller, and removed when it exits), shared by the test processes and the subprocesses they
  start (training runs, ``foldax`` commands), which inherit the environment. Most of the suite's
  time is XLA compiling, and many tests compile the same programs again: the fault-injection and
  preemption tests alone start ~20 training processes. Measured on 2026-12-07, one core each, side
  by side: tests/test_faults.py and tests/test_train_preemption.py ran in 448 s with the cache,
  while without it 8 of their 20 tests had finished; tests/test_turner_model.py and
  tests/test_expected_f1.py took 712 s against 775 s with the cache in the subprocesses only (one
  test there trains twice in its process). JAX's cache keys hold the program, the compile options
  and XLA flags, the devices and the versions, so a program is only reused where it would be
  compiled to the same code.
* ``foldax fold``'s program cache and training's own cache stay off (``FOLDAX_CACHE_DIR=''``)
  unless a test sets them: those caches shared across tests made their results depend on each
  other's programs. Tests of ``foldax fold``'s program cache turn JAX's off for themselves (a
  program that came from JAX's cache is not saved again).
* Every program XLA compiles for the CPU keeps its machine code in memory mappings of its own (about
  70 for a small stacking ``pair_probs``, 500-1,600 for a Turner ``log_partition``, ``pair_probs`` or
  gradient), and JAX keeps every program it compiled for as long as the process lives. The whole
  suite in one process climbed towards Linux's limit of 65,530 mappings per process
  (``vm.max_map_count``: 19,000 at a tenth of the suite), and XLA died with a segmentation fault
  while compiling about four fifths of the way through. So JAX's caches are cleared after each test
  file, and after any test that leaves the process above half the limit (:mod:`foldax.layers.compiled`).
"""

import atexit
import os
import shutil
import tempfile

import jax
import pytest

from compile_flags import session_flags
from foldax.layers.compiled import mapped_regions, release_compiled_programs

os.environ["FOLDAX_CACHE_DIR"] = ""
# Before JAX starts its CPU backend, which reads XLA_FLAGS once (nothing above computes anything).
os.environ["XLA_FLAGS"] = session_flags(os.environ.get("XLA_FLAGS", ""))

if "FOLDAX_TEST_JAX_CACHE" not in os.environ:  # the session's first process: pytest, or xdist's controller
    os.environ["FOLDAX_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="foldax-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["FOLDAX_TEST_JAX_CACHE"], True)
#: JAX's persistent-cache options: set in this process, and as environment variables for its subprocesses.
JAX_CACHE_OPTIONS = {"jax_compilation_cache_dir": os.environ["FOLDAX_TEST_JAX_CACHE"],
                     "jax_persistent_cache_min_compile_time_secs": 0.5,
                     "jax_persistent_cache_min_entry_size_bytes": 0}
for _name, _value in JAX_CACHE_OPTIONS.items():
    os.environ[_name.upper()] = str(_value)
    jax.config.update(_name, _value)  # (this process imported JAX before the variable was set)

jax.config.update("jax_enable_x64", True)

#: Clear JAX's caches after a test once the process holds this many memory mappings.
MAPPINGS_HIGH_WATER = 32_768


@pytest.fixture(autouse=True, scope="module")
def _release_programs_after_each_file():
    yield
    release_compiled_programs()


@pytest.fixture(autouse=True)
def _release_programs_at_high_water():
    yield
    if mapped_regions() > MAPPINGS_HIGH_WATER:
        release_compiled_programs()
