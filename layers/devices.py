"""All cores by default: one XLA CPU device per core, and batches split over the devices.

XLA runs the DP's many small per-diagonal operations on one thread per device, so a
plain CPU process uses one core. Started with one CPU device per core, the batched
public functions (:func:`foldax.layers.log_partition`, :func:`foldax.layers.pair_probs`,
:func:`foldax.layers.best_structure`, ...) split a batch over the devices themselves
(:func:`over_local_devices`); nothing else changes. The device count is fixed when JAX
starts (its first computation), hence the one-liner at the top of a script::

    from foldax import layers
    layers.use_all_cores()          # before the first JAX computation
    tokens, lengths = layers.encode_batch(sequences)
    layers.log_partition(layers.default_params(), tokens, lengths)   # split over the cores

``JAX_NUM_CPU_DEVICES=N python script.py`` does the same from outside (``N = 1``: one
device). The ``foldax`` command line and the training program take one device per core
unless the user chose a count (``JAX_NUM_CPU_DEVICES``, or
``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``): :func:`default_cpu_devices`.

How a batch is split (:func:`over_local_devices`): a concrete batch of ``B`` rows that is
not already placed on several devices, outside any ``jax.set_mesh`` context, runs on the
largest ``k <= jax.local_device_count()`` that divides ``B`` (so no row is padded or
wasted): its batched arguments are placed along a 1-axis mesh of the first ``k`` devices
(sharded on their leading axis), the rest (parameters, keys, scalars) replicated, and the
jit-compiled function partitions itself (GSPMD). Results are identical to one device
(the rows are independent); they come back as arrays sharded over those ``k`` devices.
Under ``jit``, ``grad`` or ``vmap`` (traced arguments) nothing is split: the caller's
program decides its sharding.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

__all__ = ["cpu_cores", "cpu_devices_chosen", "use_all_cores", "default_cpu_devices", "split_count", "batch_mesh",
           "over_local_devices"]

#: The XLA flag that also sets the CPU device count (the older way).
XLA_DEVICE_FLAG = "xla_force_host_platform_device_count"


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under ``taskset``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def cpu_devices_chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CPU device count was set by the user: ``JAX_NUM_CPU_DEVICES`` or
    ``--xla_force_host_platform_device_count`` (``XLA_FLAGS``) in the environment, or
    ``jax.config.update("jax_num_cpu_devices", n)`` already called in this process."""
    environ = os.environ if environ is None else environ
    if environ.get("JAX_NUM_CPU_DEVICES", "").strip() or XLA_DEVICE_FLAG in environ.get("XLA_FLAGS", ""):
        return True
    import sys

    jax = sys.modules.get("jax")
    return jax is not None and int(jax.config.jax_num_cpu_devices) >= 0


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def use_all_cores(num_devices: int | None = None, *, divides: int | None = None) -> int:
    """Starts JAX's CPU backend with one device per core (or ``num_devices``); returns the count.

    Must run before JAX's first computation (creating an array counts; importing
    ``jax`` or ``layers`` does not). ``divides``: use the largest count ``<=`` the cores
    that divides this number (e.g. a batch size that must split evenly over devices).
    Calling it again with the same count is harmless; too late with another count is a
    :class:`RuntimeError` that says what to do instead.

    Example (in a fresh process):
      >>> from foldax import layers
      >>> n = layers.use_all_cores()    # doctest: +SKIP
    """
    import jax

    cores = cpu_cores() if num_devices is None else int(num_devices)
    if cores < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    count = cores if divides is None else _largest_divisor(int(divides), cores)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        running = jax.local_device_count(backend="cpu")
        if running == count:
            return count
        raise RuntimeError(
            f"layers.use_all_cores() came too late: JAX already runs with {running} CPU device(s), and the count "
            f"is fixed when JAX starts. Call it right after the imports, before any array is created, or start "
            f"Python with JAX_NUM_CPU_DEVICES={count} in the environment") from None
    return count


def default_cpu_devices(*, divides: int | None = None) -> int | None:
    """For entry points (``foldax``, the training program): :func:`use_all_cores` unless the user
    chose a count (:func:`cpu_devices_chosen`) or JAX has already started; returns the count set,
    or None when it left JAX as it was. Never raises."""
    if cpu_devices_chosen():
        return None
    try:
        return use_all_cores(divides=divides)
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=None)
def batch_mesh(k: int):
    """The 1-axis mesh ``("batch",)`` of the first ``k`` local devices."""
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.asarray(jax.local_devices()[:k]), ("batch",))


def _is_traced(args) -> bool:
    import jax

    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(args))


def split_count(batch: int) -> int:
    """Over how many local devices a batch of ``batch`` rows is split: the largest count that divides
    it and is at most ``jax.local_device_count()`` (1: not split; also with several processes)."""
    import jax

    if batch < 2 or jax.process_count() > 1:
        return 1
    return _largest_divisor(int(batch), jax.local_device_count())


def _devices_to_use(tokens) -> int:
    """How many devices a batch ``tokens [B, ...]`` is split over (1: not at all)."""
    import jax

    if getattr(tokens, "ndim", 0) < 2 or isinstance(tokens, jax.core.Tracer):
        return 1
    if not jax.sharding.get_abstract_mesh().empty:
        return 1  # a mesh the caller set: the caller places the batch
    if isinstance(tokens, jax.Array) and len(tokens.sharding.device_set) > 1:
        return 1  # already spread over devices by the caller
    return split_count(tokens.shape[0])


def _place(arg, batch: int, mesh):
    """A batched array (leading axis ``batch``) sharded over ``mesh``; anything else replicated."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    if arg is None:
        return None
    if isinstance(arg, Mapping):  # parameters: replicated, whatever their shapes
        return jax.device_put(arg, NamedSharding(mesh, PartitionSpec()))
    spec = PartitionSpec("batch") if np.ndim(arg) >= 1 and np.shape(arg)[0] == batch else PartitionSpec()
    return jax.device_put(arg, NamedSharding(mesh, spec))


def over_local_devices(fn, tokens):
    """``fn`` (a jit-compiled function of a batch), or a wrapper that splits ``tokens``'s batch over
    the local devices: see the module docstring for when. The wrapper's positional arguments
    whose leading axis has the batch's length are sharded, the others replicated."""
    k = _devices_to_use(tokens)
    if k == 1:
        return fn
    batch, mesh = int(tokens.shape[0]), batch_mesh(k)

    @functools.wraps(fn)
    def split(*args):
        if _is_traced(args):
            return fn(*args)
        return fn(*(_place(a, batch, mesh) for a in args))

    return split
