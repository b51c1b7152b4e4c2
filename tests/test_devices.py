"""One device per core (``foldax.layers.devices``): a batch split over 2 CPU devices gives the results of 1.

The device count is fixed when JAX starts, so the runs happen in subprocesses with
``JAX_NUM_CPU_DEVICES``; this file doubles as the script they run
(``python tests/test_devices.py results OUT.npz [turner]``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from foldax.layers import devices

ROOT = Path(__file__).resolve().parents[1]


FAST = ("log_z", "probs", "best", "odd", "one")


def results(out: str, which: str) -> None:
    """The batched public functions on fixed inputs (``which``: ``fast`` -- :data:`FAST` --,
    ``full`` or ``turner``); arrays to ``out``, plus on how many devices each result lives
    (``devices_<name>``)."""
    import jax
    import jax.numpy as jnp

    from foldax import layers

    rng = np.random.default_rng(0)
    if which == "turner":
        params = layers.turner2004()
        tokens = np.asarray(rng.integers(0, 4, (4, 32)), np.int32)
        lengths = np.array([32, 25, 0, 18], np.int32)
        calls = {"log_z": lambda: layers.log_partition(params, tokens, lengths),
                 "best": lambda: layers.best_structure(params, tokens, lengths)}
    else:
        params = layers.init_params(jax.random.key(0), scale=1.0)
        tokens = np.asarray(rng.integers(0, 5, (6, 40)), np.int32)
        lengths = np.array([40, 31, 0, 9, 40, 17], np.int32)
        phi = rng.normal(size=(6, 40, 40)).astype(np.float32)
        odd = tokens[:3], lengths[:3]  # 3 rows: not split over 2 devices (no padding, no waste)
        loss = lambda p: layers.log_partition(p, tokens, lengths).sum()
        calls = {
            "log_z": lambda: layers.log_partition(params, tokens, lengths, phi=phi),
            "max": lambda: layers.max_score(params, tokens, lengths),
            "probs": lambda: layers.pair_probs(params, tokens, lengths),
            "best": lambda: layers.best_structure(params, tokens, lengths),
            "mea": lambda: layers.mea_structure(layers.pair_probs(params, tokens, lengths), lengths, gamma=2.0),
            "score": lambda: layers.structure_score(params, tokens, layers.best_structure(params, tokens, lengths),
                                                    lengths),
            "log_prob": lambda: layers.log_prob(params, tokens, layers.best_structure(params, tokens, lengths),
                                                lengths),
            "samples": lambda: layers.sample_structures(jax.random.key(3), params, tokens, 5, lengths),
            "odd": lambda: layers.log_partition(params, *odd),
            "jit": lambda: jax.jit(layers.log_partition)(params, tokens, lengths),
            "grad_stack": lambda: jax.grad(loss)(params)["stack"],
            "one": lambda: layers.log_partition(params, jnp.asarray(tokens[0])),
        }
    arrays = {}
    for name, call in calls.items():
        if which == "fast" and name not in FAST:
            continue
        value = call()
        arrays[name] = np.asarray(value)
        arrays[f"devices_{name}"] = np.asarray(len(value.sharding.device_set))
    np.savez(out, device_count=jax.device_count(), **arrays)


def _env(count: int | None) -> dict:
    """The environment of a fresh process with ``count`` CPU devices (None: JAX's default)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if devices.XLA_DEVICE_FLAG not in f)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    if count is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(count)
    return env


def _run_all(commands: list[tuple[list[str], dict]]) -> list[str]:
    """Runs the commands side by side (each its own JAX); their stdouts, after checking they succeeded."""
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in commands]
    outs = [p.communicate(timeout=900) for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    return [out for out, _ in outs]


def _results(tmp_path, which: str, counts=(1, 2)) -> list[dict]:
    paths = [tmp_path / f"results_{count}_{which}.npz" for count in counts]
    _run_all([([sys.executable, __file__, "results", str(path), which], _env(count))
              for path, count in zip(paths, counts)])
    loaded = []
    for path in paths:
        with np.load(path) as f:
            loaded.append({k: f[k] for k in f.files})
    return loaded


def _assert_same(one: dict, two: dict) -> None:
    for name in (k for k in one if not k.startswith("devices_") and k != "device_count"):
        if one[name].dtype.kind in "iub":
            np.testing.assert_array_equal(two[name], one[name], err_msg=name)
        else:
            np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("which", ["fast", pytest.param("full", marks=pytest.mark.slow)])
def test_a_batch_split_over_two_devices_equals_one_device(tmp_path, which):
    one, two = _results(tmp_path, which)
    assert int(one["device_count"]) == 1 and int(two["device_count"]) == 2
    _assert_same(one, two)
    split = [k for k in ("log_z", "max", "probs", "best", "mea", "score", "log_prob", "samples") if k in one]
    assert all(int(two[f"devices_{name}"]) == 2 for name in split), {k: two[f"devices_{k}"] for k in split}
    # Not split: an odd batch, one sequence, traced calls (jit, grad: the caller's program decides).
    kept = [k for k in ("odd", "one", "jit", "grad_stack") if k in one]
    assert all(int(two[f"devices_{name}"]) == 1 for name in kept)
    assert all(int(one[f"devices_{name}"]) == 1 for name in split)  # one device: nothing changes


@pytest.mark.slow
def test_turner_batch_split_over_two_devices_equals_one_device(tmp_path):
    one, two = _results(tmp_path, "turner")
    _assert_same(one, two)
    assert int(two["devices_log_z"]) == 2 and int(two["devices_best"]) == 2


USE_ALL_CORES = textwrap.dedent(
    """
    import os, sys
    import jax
    from foldax import layers
    from foldax.layers import devices
    assert not devices.cpu_devices_chosen()
    n = layers.use_all_cores(%s)
    assert jax.device_count() == n, (jax.device_count(), n)
    assert layers.use_all_cores(n) == n  # again, same count: fine
    try:
        layers.use_all_cores(n + 1)
    except RuntimeError as err:
        assert "too late" in str(err) and f"JAX_NUM_CPU_DEVICES={n + 1}" in str(err), err
    else:
        raise AssertionError("no error when called too late")
    assert devices.default_cpu_devices() is None  # an entry point after the user chose: left alone
    print(n)
    """
)


SETUP_JAX = textwrap.dedent(
    """
    import jax, ml_collections
    from foldax.train import train as trainer
    trainer.setup_jax(ml_collections.ConfigDict({"batch_size": 4, "eval_batch_size": 6}))
    print(jax.device_count())
    """
)


def test_use_all_cores_before_jax_starts_and_too_late():
    cases = {"": devices.cpu_cores(), "3": 3, "divides=9": max(d for d in (1, 3, 9) if d <= devices.cpu_cores())}
    commands = [([sys.executable, "-c", USE_ALL_CORES % argument], _env(None)) for argument in cases]
    # the training program: one device per core that divides both batch sizes (gcd 2), unless the user chose
    commands += [([sys.executable, "-c", SETUP_JAX], _env(None)), ([sys.executable, "-c", SETUP_JAX], _env(1))]
    outs = [int(out.split()[-1]) for out in _run_all(commands)]
    assert outs == [*cases.values(), min(2, devices.cpu_cores()), 1]


def test_a_user_choice_is_respected():
    assert devices.cpu_devices_chosen({"JAX_NUM_CPU_DEVICES": "1"})
    assert devices.cpu_devices_chosen({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert not devices.cpu_devices_chosen({"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})  # another flag
    assert [devices._largest_divisor(b, 4) for b in (1, 2, 3, 6, 7, 8, 12)] == [1, 2, 3, 3, 1, 4, 4]


if __name__ == "__main__":
    if sys.argv[1] == "results":
        results(sys.argv[2], sys.argv[3])
