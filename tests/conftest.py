"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly); compiled-program
caches (``foldax fold``'s and training's persistent XLA cache) in a folder of this session, not the
user's ``~/.cache/foldax`` (subprocesses inherit it)."""

import os
import tempfile

import jax
import pytest

os.environ.setdefault("FOLDAX_CACHE_DIR", tempfile.mkdtemp(prefix="foldax-test-cache-"))

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _persistent_cache_off_unless_the_test_turns_it_on():
    """Every test starts with JAX's persistent compilation cache off. Training (``setup_jax``) turns it
    on, also from module-scoped fixtures, and it would stay on for later tests. (jax 0.12 can crash
    writing some executables to that cache -- seen with Turner ``sample_structures`` in a process
    that had written other programs to it -- so tests that do not test the cache keep it off.)"""
    if jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache:
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()
    yield
