"""Killing a training process: SIGKILL mid-run + restart is bit-identical to an uninterrupted run;
SIGTERM and Ctrl-C save a checkpoint and exit cleanly. (Real subprocesses of ``python -m foldax.train.main train``;
more faults in tests/test_faults.py.)"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_train_parallel import _env, _export, _overrides  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from test_train import write_dataset

    return write_dataset(tmp_path_factory.mktemp("data"))


def _command(files, workdir, steps, *extra):
    return [sys.executable, "-m", "foldax.train.main", "train", "--config", str(ROOT / "configs" / "tiny.py"),
            *_overrides(files), f"--config.num_train_steps={steps}", "--config.checkpoint_every=10",
            f"--config.eval_every={steps}", "--workdir", str(workdir), *extra]


def _wait_for_checkpoint(workdir, step, proc, timeout=300):
    """Waits until Orbax has finalised the checkpoint of ``step`` (its directory has the final name)."""
    target = Path(workdir) / "checkpoints" / str(step)
    deadline = time.time() + timeout
    while not target.exists():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError("no checkpoint in time")
        time.sleep(0.05)


def test_sigkill_and_restart_is_bit_identical(files, tmp_path):
    steps = 40
    straight = subprocess.run(_command(files, tmp_path / "straight", steps), env=_env(1), cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_command(files, killed, steps), env=_env(1), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(killed, 10, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "summary.json").exists()  # it really was killed mid-run

    restart = subprocess.run(_command(files, killed, steps), env=_env(1), cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
    assert restart.returncode == 0, restart.stderr[-3000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 10 and summary["steps"] == steps
    assert not list((killed / "checkpoints").glob("*.orbax-checkpoint-tmp*"))

    a = _export(tmp_path / "straight", tmp_path / "a.npz")
    b = _export(killed, tmp_path / "b.npz")
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)  # bit for bit


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_saves_and_exits_cleanly(files, tmp_path, signum):
    """SIGTERM, and Ctrl-C (SIGINT, which used to end in a KeyboardInterrupt traceback and save nothing)."""
    workdir = tmp_path / "run"
    proc = subprocess.Popen(_command(files, workdir, 5000), env=_env(1), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(workdir, 10, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "preempted" and 10 <= result["steps"] < 5000
    assert ("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)") in out
    assert (workdir / "checkpoints" / str(result["steps"])).is_dir()  # saved at the step it stopped
    assert (workdir / "checkpoints" / str(result["steps"]) / "foldax_manifest.json").is_file()  # and sealed
    assert not list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    params = _export(workdir, tmp_path / "p.npz")
    assert np.isfinite(params["stack"]).all()
