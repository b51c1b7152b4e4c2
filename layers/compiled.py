"""Compiled programs and the process's memory mappings: give programs back before XLA runs out.

Every program XLA compiles for the CPU keeps its machine code in memory mappings of its own, and
JAX keeps every compiled program for as long as the process lives. Measured with jaxlib 0.12
(``/proc/self/maps`` line counts): a small stacking ``pair_probs`` holds about 70 mappings; a
Turner ``pair_probs`` about 270 plus 400 per chunk of diagonals (2,000 at 128 nt, 3,600 at 256 nt);
one ``foldax fold -p`` program about 900 per chunk. Linux allows ``vm.max_map_count`` mappings
per process (65,530 by default). At the limit XLA cannot map new code while compiling and the
process dies ("LLVM ERROR: Unable to allocate section memory", or a segmentation fault), which a
few dozen programs for different lengths and batch sizes reach.

So a process that compiles programs for many shapes gives them back as it nears the limit:
:func:`release_compiled_programs` with ``if_crowded=True`` clears JAX's caches once more than
:func:`high_water` (half the limit by default) of the mappings are taken. The command line, the
training program and the evaluation call it the first time they meet a shape
(:class:`ShapeWatch`). A released program is compiled again when it is next used (or loaded from a
persistent cache), so only time is lost. Example, a script that folds many lengths::

    from foldax import layers

    watch = layers.ShapeWatch()
    for tokens, lengths in batches:          # many different [B, L]
        watch(tokens.shape)                  # releases programs only when mappings run short
        probs = layers.pair_probs(params, tokens, lengths)

This module imports JAX only to release programs (reading the counts needs none).
"""

from __future__ import annotations

import gc
import os

__all__ = ["mapped_regions", "mapping_limit", "high_water", "crowded", "release_compiled_programs", "ShapeWatch"]

#: Linux's default ``vm.max_map_count`` (used where ``/proc/sys/vm/max_map_count`` cannot be read).
DEFAULT_MAPPING_LIMIT = 65_530
#: Share of the limit above which programs are released (``FOLDAX_MAPPINGS_HIGH_WATER`` overrides it).
HIGH_WATER_FRACTION = 0.5


def mapped_regions() -> int:
    """How many memory mappings this process holds (0 where ``/proc/self/maps`` cannot be read).

    Reading it costs about 1 microsecond per mapping (35 ms at 30,000), hence :class:`ShapeWatch`
    rather than a check on every call."""
    try:
        with open("/proc/self/maps", "rb") as fh:
            return fh.read().count(b"\n")
    except OSError:
        return 0


def mapping_limit() -> int:
    """Linux's limit on memory mappings per process (``vm.max_map_count``)."""
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return DEFAULT_MAPPING_LIMIT


def high_water(environ=None) -> int:
    """Mappings above which :func:`crowded` is true: ``FOLDAX_MAPPINGS_HIGH_WATER`` (a share of the
    limit in (0, 1], e.g. ``0.5``) or :data:`HIGH_WATER_FRACTION` of :func:`mapping_limit`."""
    environ = os.environ if environ is None else environ
    text = environ.get("FOLDAX_MAPPINGS_HIGH_WATER", "").strip()
    fraction = HIGH_WATER_FRACTION
    if text:
        try:
            fraction = float(text)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"FOLDAX_MAPPINGS_HIGH_WATER must be a share of the mapping limit in (0, 1], "
                             f"got {text!r}")
    return int(fraction * mapping_limit())


def crowded() -> bool:
    """Whether this process holds more memory mappings than :func:`high_water`."""
    return mapped_regions() > high_water()


def release_compiled_programs(*, if_crowded: bool = False) -> bool:
    """Clears JAX's caches of compiled programs (``jax.clear_caches()``) and collects garbage, which
    unmaps their code; with ``if_crowded``, only when :func:`crowded`. Returns whether it released.

    Programs the caller still holds (e.g. a ``jax.stages.Compiled``) stay mapped: drop them first."""
    if if_crowded and not crowded():
        return False
    import jax

    jax.clear_caches()
    gc.collect()
    return True


class ShapeWatch:
    """Calls :func:`release_compiled_programs` (``if_crowded=True``) the first time it sees each key.

    A new input shape is where a new program gets compiled, so that is where the mappings are
    checked; a shape seen before costs a set lookup. ``on_release`` (optional) runs before JAX's
    caches are cleared, to drop programs the caller holds itself. ``releases`` counts releases."""

    def __init__(self, on_release=None):
        self.on_release = on_release
        self.releases = 0
        self._seen: set = set()

    def __call__(self, *key) -> bool:
        key = tuple(tuple(k) if isinstance(k, (list, tuple)) else k for k in key)
        if key in self._seen:
            return False
        self._seen.add(key)
        if not crowded():
            return False
        if self.on_release is not None:
            self.on_release()
        release_compiled_programs()
        self.releases += 1
        return True
