"""Tests for train/: the training loop, checkpoints, resume, divergence, eval and export (in-process)."""

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import layers
from data.formats import RnaRecord, write_records
from train import main as train_main
from train import train as trainer
from train.input_pipeline import InputPipeline, PipelineConfig
from train.main import load_config_file

ROOT = Path(__file__).resolve().parents[1]


def random_table(rng, n, min_hairpin=3):
    table = -np.ones(n, np.int32)
    stack = []
    for i in range(n):
        r = rng.random()
        if r < 0.35:
            stack.append(i)
        elif r < 0.7 and stack and i - stack[-1] > min_hairpin:
            j = stack.pop()
            table[i], table[j] = j, i
    return table


def write_dataset(folder, sizes=(("train", 96), ("valid", 8), ("test", 8)), seed=0, lengths=(20, 60)):
    """Random sequences with random nested structures as .dbn files; returns {split: path}."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, num in sizes:
        records = []
        for k in range(num):
            n = int(rng.integers(*lengths))
            seq = "".join(rng.choice(list("ACGU"), n))
            records.append(RnaRecord(f"{split}_{k}", seq, random_table(rng, n)))
        path = Path(folder) / f"{split}.dbn"
        write_records(path, records)
        out[split] = str(path)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"))


def small_config(dataset, **changes):
    """configs/tiny.py on the .dbn files of ``dataset`` (one bucket of 64)."""
    config = load_config_file(str(ROOT / "configs" / "tiny.py"))
    config.data.train_files = dataset["train"]
    config.data.valid_files = dataset["valid"]
    config.data.eval_files = dataset["test"]
    config.data.max_length = config.data.max_eval_length = 64
    config.data.buckets = config.data.eval_buckets = (64,)
    config.num_train_steps = 20
    config.eval_every = config.checkpoint_every = 10
    config.progress_bar = False
    for key, value in changes.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def read_npz(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


# ------------------------------------------------------------------ end to end


def test_train_eval_export_and_resume(dataset, tmp_path):
    workdir = str(tmp_path / "run")
    config = small_config(dataset)
    summary = trainer.train_and_evaluate(config, workdir)
    assert summary["status"] == "finished" and summary["steps"] == 20
    assert 0.0 <= summary["test/mea/f1"] <= 1.0 and summary["test/ll_per_nt"] < 0
    assert summary["best_step"] in (10, 20) and "valid/mea/f1" in summary
    on_disk = json.loads((Path(workdir) / "summary.json").read_text())
    assert on_disk["steps"] == 20 and on_disk["wall_time_s"] > 0
    assert (Path(workdir) / "config.json").exists()
    rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and any("valid/mea/f1" in r for r in rows)
    assert list(Path(workdir).glob("events.out.tfevents.*")), "no TensorBoard event file"
    ckpts = sorted(int(p.name) for p in (Path(workdir) / "checkpoints").iterdir() if p.name.isdigit())
    assert 20 in ckpts

    # losses went down
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses[-1] < losses[0]

    # eval: metrics of the best checkpoint on the test split (same as the summary's)
    assert train_main.main(["eval", "--workdir", workdir]) == 0
    metrics = json.loads((Path(workdir) / "eval_test.json").read_text())
    assert metrics["step"] == summary["best_step"]
    assert metrics["mea/f1"] == pytest.approx(summary["test/mea/f1"], abs=1e-6)

    # export-params: float32 tensors layers.log_partition accepts
    out = str(tmp_path / "params.npz")
    assert train_main.main(["export-params", "--workdir", workdir, "--out", out]) == 0
    params = read_npz(out)
    assert sorted(params) == ["loop", "pair", "stack", "unpaired"]
    assert all(v.dtype == np.float32 for v in params.values())
    assert np.isfinite(float(layers.log_partition(params, layers.encode("GGGAAACCC"))))
    assert train_main.main(["export-params", "--workdir", workdir, "--output", str(tmp_path / "p2.npz"),
                            "--checkpoint", "latest"]) == 0

    # the same workdir again: resumes at the end, trains nothing more
    again = trainer.train_and_evaluate(small_config(dataset), workdir)
    assert again["resumed_from_step"] == 20 and again["steps"] == 20
    # ... and with more steps it continues from 20 (via the CLI, config from the workdir + an override)
    assert train_main.main(["train", "--workdir", workdir, "--config.num_train_steps=25",
                            "--config.progress_bar=false"]) == 0
    assert json.loads((Path(workdir) / "summary.json").read_text())["steps"] == 25


def test_cli_errors(tmp_path, capsys):
    assert train_main.main(["eval", "--workdir", str(tmp_path / "nothing")]) == 1
    assert "config.json" in capsys.readouterr().err
    assert train_main.main(["frobnicate"]) == 2
    assert train_main.main(["train", "--workdir", str(tmp_path), "--config", str(ROOT / "configs" / "tiny.py"),
                            "--config.nope=1"]) == 1


def test_batch_size_must_divide_devices(monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    with pytest.raises(ValueError, match="multiple of the number of devices"):
        trainer.check_batch_size(12)
    assert trainer.check_batch_size(16) == 16 // jax.process_count()


# --------------------------------------------------------------- checkpoints


def _pipeline(dataset, config):
    from data.examples import load_examples

    examples, _ = load_examples(dataset["train"])
    return InputPipeline(examples, PipelineConfig(batch_size=8, buckets=(64,), seed=1, shard_index=0,
                                                  shard_count=1))


def _copy(tree):
    return jax.tree.map(lambda x: np.array(x), nnx.to_pure_dict(tree))


def _assert_trees_equal(a, b):
    flat_a, tree_a = jax.tree.flatten(a)
    flat_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("model_name", ["stacking", "neural"])
def test_checkpoint_round_trip(dataset, tmp_path, model_name):
    config = small_config(dataset, **{"model.name": model_name, "model.features": 8, "model.pair_features": 4})
    mesh = trainer.make_mesh()
    graphdef, host_state, schedule = trainer.create_state(config, 20)
    pipe = _pipeline(dataset, config)
    with jax.set_mesh(mesh):
        state = trainer.replicate(host_state, mesh)
        step = trainer.make_train_step(graphdef, config, schedule, mesh)
        it = iter(pipe)
        for _ in range(3):
            state, _ = step(state, trainer.to_global_batch(next(it), mesh))
        manager = trainer.make_checkpoint_manager(str(tmp_path), config)
        trainer._save(manager, 3, state, it, metrics={"mea/f1": 0.5})
        manager.wait_until_finished()
        saved = _copy(state)

        fresh_manager = trainer.make_checkpoint_manager(str(tmp_path), config)
        assert fresh_manager.latest_step() == 3 and fresh_manager.best_step() == 3
        it2 = iter(pipe)
        fresh = trainer.replicate(trainer.create_state(config, 20)[1], mesh)
        restored = trainer._restore(fresh_manager, 3, fresh, mesh, it2)
        _assert_trees_equal(_copy(restored), saved)  # params and optimizer state, bit for bit

        b1, b2 = next(it), next(it2)
        _assert_trees_equal(b1, b2)  # the input pipeline resumes at the same batch
        state, m1 = step(state, trainer.to_global_batch(b1, mesh))
        restored, m2 = step(restored, trainer.to_global_batch(b2, mesh))
        assert float(m1["loss"]) == float(m2["loss"])
        _assert_trees_equal(_copy(restored), _copy(state))
        manager.close()
        fresh_manager.close()


def test_interrupted_checkpoint_is_never_used(dataset, tmp_path):
    """A step directory Orbax did not finalise (its tmp name) is ignored and cleaned up on resume."""
    workdir = tmp_path / "run"
    config = small_config(dataset, num_train_steps=10)
    trainer.train_and_evaluate(config, str(workdir))
    ckpts = workdir / "checkpoints"
    # a half-written step 15: what an interrupted (killed) save leaves behind
    partial = ckpts / "15.orbax-checkpoint-tmp-1234567890"
    shutil.copytree(ckpts / "10", partial)
    for f in list(partial.rglob("*"))[::2]:
        if f.is_file():
            f.write_bytes(b"garbage")
    manager = trainer.make_checkpoint_manager(str(workdir), config, read_only=True)
    assert manager.latest_step() == 10 and manager.all_steps() == [10]
    manager.close()
    summary = trainer.train_and_evaluate(small_config(dataset, num_train_steps=12), str(workdir))
    assert summary["resumed_from_step"] == 10 and summary["steps"] == 12
    assert not partial.exists()  # cleaned up


def test_nan_loss_stops_and_keeps_last_good_checkpoint(dataset, tmp_path, monkeypatch):
    workdir = str(tmp_path / "run")
    trainer.train_and_evaluate(small_config(dataset, num_train_steps=10), workdir)
    good = read_npz(trainer.export_params(workdir, str(tmp_path / "good.npz"), which="latest"))

    real_loss = trainer.cll_loss

    def nan_loss(model, batch, l2=0.0):
        loss, aux = real_loss(model, batch, l2)
        return loss * np.nan, aux

    monkeypatch.setattr(trainer, "cll_loss", nan_loss)
    with pytest.raises(trainer.TrainingDiverged, match=r"non-finite loss .* at step 11.*last good checkpoint \(step 10\)"):
        trainer.train_and_evaluate(small_config(dataset, num_train_steps=20), workdir)
    monkeypatch.undo()
    manager = trainer.make_checkpoint_manager(workdir, small_config(dataset), read_only=True)
    assert manager.latest_step() == 10
    manager.close()
    after = read_npz(trainer.export_params(workdir, str(tmp_path / "after.npz"), which="latest"))
    _assert_trees_equal(after, good)
    # via the CLI: exit status 1 and the message on stderr
    monkeypatch.setattr(trainer, "cll_loss", nan_loss)
    assert train_main.main(["train", "--workdir", workdir, "--config.num_train_steps=20"]) == 1


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "archiveii" / "archiveii.tsv").exists()
                    and not os.environ.get("FOLDAX_ARCHIVEII"), reason="ArchiveII not available")
def test_tiny_config_smoke(tmp_path):
    """configs/tiny.py as shipped (ArchiveII subset): trains and evaluates end to end."""
    config = load_config_file(str(ROOT / "configs" / "tiny.py"))
    config.progress_bar = False
    summary = trainer.train_and_evaluate(config, str(tmp_path / "tiny"))
    assert summary["status"] == "finished" and summary["steps"] == config.num_train_steps
    assert summary["test/n_seqs"] > 0 and np.isfinite(summary["test/ll_per_nt"])


def test_neural_config_trains(dataset, tmp_path):
    """configs/neural.py's model (small) through the whole loop: train, validate, test, export."""
    config = load_config_file(str(ROOT / "configs" / "neural.py"))
    small = small_config(dataset, num_train_steps=10, eval_every=10)
    small.model = config.model
    small.model.features, small.model.pair_features, small.model.num_layers = 8, 4, 1
    summary = trainer.train_and_evaluate(small, str(tmp_path / "neural"))
    assert summary["status"] == "finished" and summary["num_params"] > 656
    assert np.isfinite(summary["test/ll_per_nt"])
    params = read_npz(trainer.export_params(str(tmp_path / "neural"), str(tmp_path / "p.npz")))
    assert params["stack"].shape == (5, 5, 5, 5)


def test_bad_best_metric_is_a_clear_error(dataset, tmp_path):
    with pytest.raises(ValueError, match="best_metric"):
        trainer.train_and_evaluate(small_config(dataset, best_metric="best/f1"), str(tmp_path / "x"))
