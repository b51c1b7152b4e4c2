"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly), no persistent
compiled-program caches, and compiled programs released between test files.

* No persistent caches (neither ``foldax fold``'s nor training's XLA cache, in this process or the
  subprocesses, which inherit the environment), unless a test sets ``FOLDAX_CACHE_DIR`` or JAX's
  cache itself: a cache shared across tests made their results depend on each other's programs.
* Every program XLA compiles for the CPU keeps its machine code in memory mappings of its own (about
  70 for a small stacking ``pair_probs``, 500-1,600 for a Turner ``log_partition``, ``pair_probs`` or
  gradient), and JAX keeps every program it compiled for as long as the process lives. The whole
  suite in one process climbed towards Linux's limit of 65,530 mappings per process
  (``vm.max_map_count``: 19,000 at a tenth of the suite), and XLA died with a segmentation fault
  while compiling about four fifths of the way through. So JAX's caches are cleared after each test
  file, and after any test that leaves the process above half the limit (:mod:`foldax.layers.compiled`).
"""

import os

import jax
import pytest

from foldax.layers.compiled import mapped_regions, release_compiled_programs

os.environ["FOLDAX_CACHE_DIR"] = ""

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
