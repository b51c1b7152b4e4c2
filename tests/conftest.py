"""Shared test setup: float64 available everywhere (tests pick dtypes explicitly)."""

import jax

jax.config.update("jax_enable_x64", True)
