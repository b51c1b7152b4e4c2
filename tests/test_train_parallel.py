"""Data parallelism: 8 simulated CPU devices and 2 processes give the results of 1 device.

The runs happen in subprocesses (the device count is fixed when JAX starts):
this file doubles as the script they run (``python tests/test_train_parallel.py
one-step DATA_DIR OUT.npz``).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from compile_flags import with_devices  # noqa: E402


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = with_devices(devices)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return env


def _overrides(dataset) -> list[str]:
    return [f"--config.data.train_files={dataset['train']}", f"--config.data.valid_files={dataset['valid']}",
            f"--config.data.eval_files={dataset['test']}", "--config.data.max_length=64",
            "--config.data.max_eval_length=64", "--config.data.buckets=(64,)", "--config.data.eval_buckets=(64,)",
            "--config.progress_bar=false"]


def one_step(data_dir: str, out: str) -> None:
    """One training step on a fixed global batch of 8; writes the loss and the new state to ``out``."""
    import jax
    from flax import nnx

    from foldax.data.examples import load_examples
    from test_train import small_config
    from foldax.train import train as trainer
    from foldax.train.input_pipeline import InputPipeline, PipelineConfig

    dataset = {s: str(Path(data_dir) / f"{s}.dbn") for s in ("train", "valid", "test")}
    config = small_config(dataset, batch_size=8)
    examples, _ = load_examples(dataset["train"])
    batch = InputPipeline(examples, PipelineConfig(batch_size=8, buckets=(64,), seed=1, shard_index=0,
                                                   shard_count=1)).make_batch(0)
    mesh = trainer.make_mesh()
    graphdef, host_state, schedule = trainer.create_state(config, 10)
    with jax.set_mesh(mesh):
        state = trainer.replicate(host_state, mesh)
        batch = trainer.to_global_batch(batch, mesh)
        assert len(batch["tokens"].sharding.device_set) == jax.device_count()
        step = trainer.make_train_step(graphdef, config, schedule, mesh)
        state, metrics = step(state, batch)
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
        arrays = {jax.tree_util.keystr(path): np.asarray(x) for path, x in flat}
        np.savez(out, loss=np.asarray(metrics["loss"]), devices=jax.device_count(), **arrays)


def _run_one_step(dataset_dir, out, devices):
    cmd = [sys.executable, str(Path(__file__)), "one-step", str(dataset_dir), str(out)]
    proc = subprocess.run(cmd, env=_env(devices), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from test_train import write_dataset

    folder = tmp_path_factory.mktemp("data")
    return folder, write_dataset(folder)


def test_one_step_8_devices_equals_1_device(dataset, tmp_path):
    folder, _ = dataset
    one = _run_one_step(folder, tmp_path / "one.npz", 1)
    eight = _run_one_step(folder, tmp_path / "eight.npz", 8)
    assert int(one.pop("devices")) == 1 and int(eight.pop("devices")) == 8
    assert sorted(one) == sorted(eight)
    for key in one:
        np.testing.assert_allclose(eight[key], one[key], rtol=1e-6, atol=1e-6, err_msg=key)
    assert any("stack" in k for k in one) and float(one["loss"]) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _export(workdir, out):
    cmd = [sys.executable, "-m", "foldax.train.main", "export-params", "--workdir", str(workdir), "--out", str(out),
           "--checkpoint", "latest"]
    proc = subprocess.run(cmd, env=_env(1), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files if k != "__provenance__"}


@pytest.mark.slow
def test_two_processes_equal_one_process(dataset, tmp_path):
    """jax.distributed on localhost (2 CPU processes, gloo collectives), each feeding half of every batch."""
    _, files = dataset
    common = ["train", "--config", str(ROOT / "configs" / "tiny.py"), *_overrides(files),
              "--config.num_train_steps=8", "--config.eval_every=8", "--config.checkpoint_every=4",
              "--config.batch_size=8"]
    single = subprocess.run([sys.executable, "-m", "foldax.train.main", *common, "--workdir", str(tmp_path / "one")],
                            env=_env(1), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", "foldax.train.main", *common, "--workdir", str(tmp_path / "two"),
                          "--coordinator_address", f"localhost:{port}", "--num_processes", "2",
                          "--process_id", str(i)], env=_env(1), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["devices"] == 2 and summary["steps"] == 8
    a = _export(tmp_path / "one", tmp_path / "one.npz")
    b = _export(tmp_path / "two", tmp_path / "two.npz")
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)


if __name__ == "__main__":
    if sys.argv[1] == "one-step":
        one_step(sys.argv[2], sys.argv[3])
