"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly); compiled-program
caches (``foldax fold``'s and training's persistent XLA cache) in a folder of this session, not the
user's ``~/.cache/foldax`` (subprocesses inherit it)."""

import os
import tempfile

import jax
import pytest

os.environ.setdefault("FOLDAX_CACHE_DIR", tempfile.mkdtemp(prefix="foldax-test-cache-"))

jax.config.update("jax_enable_x64", True)


_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
                  "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture(autouse=True)
def _persistent_cache_stays_in_its_test():
    """A test that trains in this process turns JAX's persistent compilation cache on (as ``foldax
    train`` does); later tests start without it. (jax 0.12 can crash writing some executables to
    that cache -- seen with Turner ``sample_structures`` after other cached programs in one process.)"""
    before = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    yield
    if any(getattr(jax.config, name) != value for name, value in before.items()):
        from jax.experimental.compilation_cache import compilation_cache

        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
