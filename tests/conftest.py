"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly); compiled-program
caches (``foldax fold``'s and training's persistent XLA cache) in a folder of this session, not the
user's ``~/.cache/foldax`` (subprocesses inherit it)."""

import os
import tempfile

import jax

os.environ.setdefault("FOLDAX_CACHE_DIR", tempfile.mkdtemp(prefix="foldax-test-cache-"))

jax.config.update("jax_enable_x64", True)
