"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly), and no persistent
compiled-program caches (neither ``foldax fold``'s nor training's XLA cache, in this process or the
subprocesses, which inherit the environment), unless a test sets ``FOLDAX_CACHE_DIR`` or JAX's cache
itself. A cache shared across tests made their results depend on each other's programs, and jax 0.12
crashed (segfault) in this suite compiling and writing programs with its persistent cache on."""

import os

import jax

os.environ["FOLDAX_CACHE_DIR"] = ""

jax.config.update("jax_enable_x64", True)
