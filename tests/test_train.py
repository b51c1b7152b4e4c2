"""Tests for train/: the training loop, checkpoints, resume, divergence, eval and export (in-process)."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from foldax import layers
from foldax.data.formats import RnaRecord, write_records
from foldax.train import main as train_main
from foldax.train import train as trainer
from foldax.train.input_pipeline import InputPipeline, PipelineConfig
from foldax.train.main import load_config_file

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
    """The arrays of an .npz (an export's provenance string left out)."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files if k != "__provenance__"}


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


def test_eval_at_start_makes_the_initial_parameters_a_candidate(dataset, tmp_path):
    """``eval_at_start``: step 0 is validated and checkpointed, so training that only makes the
    validation metric worse (a learning rate far too large) ends with the initial parameters."""
    workdir = str(tmp_path / "run")
    config = small_config(dataset, eval_at_start=True, best_metric="ll_per_nt", num_train_steps=10)
    config.optimizer.learning_rate = 5.0
    summary = trainer.train_and_evaluate(config, workdir)
    rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    valid = {r["step"]: r["valid/ll_per_nt"] for r in rows if "valid/ll_per_nt" in r}
    assert sorted(valid) == [0, 10] and valid[0] > valid[10]
    assert summary["best_step"] == 0
    best = read_npz(trainer.export_params(workdir, str(tmp_path / "best.npz")))
    latest = read_npz(trainer.export_params(workdir, str(tmp_path / "last.npz"), which="latest"))
    assert not np.array_equal(best["stack"], latest["stack"])


def test_validation_families_are_whole_families_never_trained_on():
    from foldax.data.examples import fold_split_of
    from foldax.train.datasets import validation_families

    rows = [{"family": f, "random_split": r} for f in ("tRNA", "srp", "5s") for r in ("train", "valid", "test")]
    splits = {(ex["family"], ex["random_split"]): fold_split_of(ex, "5s", validation_families("auto", "5s"))
              for ex in rows}
    assert {splits[("tRNA", r)] for r in ("train", "valid", "test")} == {"valid"}
    assert {splits[("srp", r)] for r in ("train", "valid", "test")} == {"train"}
    assert {splits[("5s", r)] for r in ("train", "valid", "test")} == {"test"}
    with pytest.raises(ValueError, match="held-out family '5s'"):
        validation_families("5s,tRNA", "5s")
    with pytest.raises(ValueError, match="unknown family trna"):
        validation_families("trna", "5s")


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
    from foldax.data.examples import load_examples

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

    from foldax.model import loss as losses

    real_loss, metric = losses.LOSSES["cll"]

    def nan_loss(model, batch, l2=0.0):
        loss, aux = real_loss(model, batch, l2)
        return loss * np.nan, aux

    monkeypatch.setitem(losses.LOSSES, "cll", (nan_loss, metric))
    with pytest.raises(trainer.TrainingDiverged, match=r"non-finite loss .* at step 11.*last good checkpoint \(step 10\)"):
        trainer.train_and_evaluate(small_config(dataset, num_train_steps=20), workdir)
    monkeypatch.undo()
    manager = trainer.make_checkpoint_manager(workdir, small_config(dataset), read_only=True)
    assert manager.latest_step() == 10
    manager.close()
    after = read_npz(trainer.export_params(workdir, str(tmp_path / "after.npz"), which="latest"))
    _assert_trees_equal(after, good)
    # via the CLI: exit status 1 and the message on stderr
    monkeypatch.setitem(losses.LOSSES, "cll", (nan_loss, metric))
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


# ------------------------------------------------------------ resuming safely (train.checkpointing)


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    """A 10-step run (one checkpoint, at step 10) that tests copy before changing."""
    workdir = tmp_path_factory.mktemp("trained") / "run"
    trainer.train_and_evaluate(small_config(dataset, num_train_steps=10), str(workdir))
    return workdir


def _copy_run(trained, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    return workdir


def test_releasing_programs_at_new_shapes_changes_no_result(dataset, tmp_path, monkeypatch):
    """With the memory-mapping high-water mark at 0, the trainer gives JAX's compiled programs back
    whenever a step meets a new batch shape (two buckets here, :mod:`foldax.layers.compiled`);
    the programs compiled again give the same training and evaluation, bit for bit."""
    from foldax.layers import compiled

    def config():
        return small_config(dataset, num_train_steps=8, eval_every=4,
                            **{"data.buckets": (32, 64), "data.eval_buckets": (32, 64)})

    plain = trainer.train_and_evaluate(config(), str(tmp_path / "plain"))
    monkeypatch.setattr(compiled, "high_water", lambda environ=None: 0)
    monkeypatch.setattr(trainer, "NEW_SHAPES", compiled.ShapeWatch())
    released = trainer.train_and_evaluate(config(), str(tmp_path / "released"))
    assert trainer.NEW_SHAPES.releases >= 3  # the train step and the eval step, at each shape they met
    metrics = [k for k in plain if k.startswith(("test/", "valid/"))]
    assert metrics and {k: plain[k] for k in metrics} == {k: released[k] for k in metrics}


def _checkpoint_bytes(workdir):
    return {p.relative_to(workdir): p.read_bytes() for p in (Path(workdir) / "checkpoints").rglob("*") if p.is_file()}


def test_eval_on_the_train_split_makes_one_pass(trained, monkeypatch):
    """`foldax eval --split train` used the repeating training pipeline and never ended."""
    real = trainer.evaluate

    def one_pass_only(eval_step, state, pipeline, mesh):
        assert pipeline.num_steps < 10**6, "evaluation over a pipeline that repeats forever"
        return real(eval_step, state, pipeline, mesh)

    monkeypatch.setattr(trainer, "evaluate", one_pass_only)
    metrics = trainer.evaluate_checkpoint(str(trained), split="train")
    assert metrics["split"] == "train" and metrics["n_seqs"] == 96  # each training example once


def test_resume_with_a_changed_shape_names_each_field(trained, tmp_path, capsys):
    workdir = _copy_run(trained, tmp_path)
    before = _checkpoint_bytes(workdir)
    assert train_main.main(["train", "--workdir", str(workdir), "--config.batch_size=16",
                            "--config.optimizer.name=sgd"]) == 1
    [message] = capsys.readouterr().err.strip().splitlines()  # one line
    assert message.startswith("foldax train: error:")
    assert "batch_size 8 -> 16" in message and "optimizer.name 'adam' -> 'sgd'" in message
    assert "drop --config" in message and f"--config.init={workdir}" in message
    with pytest.raises(trainer.ConfigChanged, match=r"model\.name 'stacking' -> 'neural'"):
        trainer.train_and_evaluate(small_config(trained_dataset(workdir), **{"model.name": "neural"}), str(workdir))
    assert _checkpoint_bytes(workdir) == before and not (workdir / "config_history.jsonl").exists()


def trained_dataset(workdir):
    data = json.loads((Path(workdir) / "config.json").read_text())["data"]
    return {"train": data["train_files"], "valid": data["valid_files"], "test": data["eval_files"]}


def test_safe_config_changes_are_allowed_and_recorded(trained, tmp_path):
    workdir = _copy_run(trained, tmp_path)
    config = small_config(trained_dataset(workdir), num_train_steps=12, eval_every=6, log_every=3)
    summary = trainer.train_and_evaluate(config, str(workdir))
    assert summary["resumed_from_step"] == 10 and summary["steps"] == 12
    [entry] = [json.loads(line) for line in (workdir / "config_history.jsonl").read_text().splitlines()]
    assert entry["from_step"] == 10
    assert entry["changes"] == {"num_train_steps": [10, 12], "eval_every": [10, 6], "log_every": [10, 3]}
    assert json.loads((workdir / "config.json").read_text())["num_train_steps"] == 12


def test_pipeline_mismatch_says_what_changed(dataset):
    from foldax.data.examples import load_examples

    examples, _ = load_examples(dataset["train"])
    config = PipelineConfig(batch_size=8, buckets=(64,), seed=1, shard_index=0, shard_count=1)
    it = iter(InputPipeline(examples, config))
    next(it)
    state = it.get_state()
    other = iter(InputPipeline(examples, dataclasses.replace(config, batch_size=16, shard_count=2)))
    with pytest.raises(ValueError, match=r"batch_size 8 -> 16, shard_count 1 -> 2 .*number of processes changed.*"
                                         r"resume with the settings the run was started with.*--config\.init="):
        other.set_state(state)
    fewer = iter(InputPipeline(examples[:-8], config))
    with pytest.raises(ValueError, match=r"the training examples \(96 then, 88 now"):
        fewer.set_state(state)
    it.set_state(state)  # the same pipeline restores fine
    it.close(), other.close(), fewer.close()


def test_second_trainer_refused_and_stale_lock_ignored(dataset, tmp_path, capsys):
    from foldax.train.checkpointing import WorkdirLock

    workdir = tmp_path / "run"
    args = ["train", "--config", str(ROOT / "configs" / "tiny.py"), "--workdir", str(workdir)]
    workdir.mkdir()
    with WorkdirLock(str(workdir)):  # as if another trainer held it (flock: per open file, also in-process)
        assert train_main.main(args) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("foldax train: error: another foldax train") and f"pid {os.getpid()}" in message
    # a lock file left by a process that died names it, but no live process holds the lock: no obstacle
    (workdir / "train.lock").write_text('{"pid": 999999, "host": "elsewhere", "started": "yesterday"}')
    with WorkdirLock(str(workdir)) as lock:
        assert json.loads(Path(lock.path).read_text())["pid"] == os.getpid()


def test_init_copies_the_parameters_of_another_run(trained, dataset):
    config = small_config(dataset, **{"model.name": "neural", "model.features": 8, "model.pair_features": 4,
                                      "model.num_layers": 1, "init": str(trained)})
    _, host_state, _ = trainer.create_state(config, 10)
    fresh = trainer._flat_params(_copy(host_state)[0])
    state = trainer._init_from_run(config, host_state, str(trained))
    params = trainer._flat_params(_copy(state)[0])
    old = read_npz(trainer.export_params(str(trained), str(Path(trained).parent / "init.npz")))
    for name in trainer.PARAM_NAMES:
        np.testing.assert_array_equal(params[f"inside/{name}"], old[name])
    others = [k for k in params if not k.startswith("inside/")]
    assert others and all(np.array_equal(params[k], fresh[k]) for k in others)  # the encoder: as initialised
    with pytest.raises(FileNotFoundError, match="not a training workdir"):
        trainer._init_from_run(config, host_state, str(Path(trained).parent))


def test_restore_for_inference_is_public(trained):
    assert trainer._restore_for_inference is trainer.restore_for_inference
    restored = trainer.restore_for_inference(str(trained), "latest")
    restored.manager.close()
    assert restored.step == 10 and restored.config.num_train_steps == 10
    config, mesh, manager, graphdef, state, step = restored  # unpacks as before
    with pytest.raises(trainer.ConfigChanged, match=r"model\.name 'stacking' -> 'neural'"):
        trainer.restore_for_inference(str(trained), config=small_config(trained_dataset(trained),
                                                                        **{"model.name": "neural"}))


def _fake_step(folder, step):
    path = Path(folder) / str(step)
    (path / "state" / "d").mkdir(parents=True)
    (path / "state" / "d" / "data").write_bytes(bytes(range(256)) * 4)
    (path / "state" / "_METADATA").write_text('{"tree": 1}')
    (path / "commit_success.txt").write_text("Checkpoint commit was successful")
    return path


def test_manifests_catch_every_kind_of_damage(tmp_path):
    from foldax.train import checkpointing as ck

    ckpts = tmp_path / "checkpoints"
    steps = {s: _fake_step(ckpts, s) for s in (10, 20, 30, 40, 50, 60)}
    legacy = ck.scan(str(ckpts))  # no manifest anywhere: a workdir of an older foldax, used unverified
    assert [c.step for c in legacy] == [60, 50, 40, 30, 20, 10] and all(c.ok and not c.verified for c in legacy)
    for path in steps.values():
        ck.seal(str(path))
    assert all(c.ok and c.verified for c in ck.scan(str(ckpts)))
    data = "state/d/data"
    os.truncate(steps[60] / data, 20)
    (steps[50] / data).unlink()
    raw = bytearray((steps[40] / data).read_bytes())
    raw[500] ^= 1
    (steps[40] / data).write_bytes(bytes(raw))
    (steps[30] / "commit_success.txt").unlink()
    (steps[20] / ck.MANIFEST).unlink()
    problems = {c.step: c.problem for c in ck.scan(str(ckpts))}
    assert problems == {
        60: f"{data} has 20 bytes where 1024 were written (truncated)",
        50: f"{data} is missing",
        40: f"{data} is corrupted (same size, different SHA-256)",
        30: "Orbax's commit marker commit_success.txt is missing",
        20: f"{ck.MANIFEST} is missing: the save was never confirmed complete (the trainer stopped while "
            f"finishing it)",
        10: None,
    }
    (steps[10] / ck.MANIFEST).write_text("{not json")
    assert ck.verify(str(steps[10])).startswith(f"{ck.MANIFEST} is unreadable")

    [check] = [c for c in ck.scan(str(ckpts)) if c.step == 60]
    moved = ck.set_aside(str(tmp_path), check)
    assert moved == str(tmp_path / ck.DAMAGED_DIR / "60") and not steps[60].exists()
    assert (Path(moved) / data).stat().st_size == 20  # kept as it was, for a look
    again = _fake_step(ckpts, 60)
    assert ck.set_aside(str(tmp_path), ck.StepCheck(60, str(again), "x", True)).endswith("60.2")
    assert (tmp_path / ck.DAMAGED_DIR / "README.txt").read_text().count("step 60") == 2


def test_config_changes_compare_paths_as_absolute(tmp_path, monkeypatch):
    from foldax.train.checkpointing import config_changes

    monkeypatch.chdir(tmp_path)
    old = {"data": {"train_files": str(tmp_path / "a.dbn") + "," + str(tmp_path / "b.dbn")}, "batch_size": 8}
    assert config_changes(old, {"data": {"train_files": "a.dbn, b.dbn"}, "batch_size": 8}) == []
    assert config_changes(old, {"data": {"train_files": "a.dbn"}, "batch_size": [8]})[0][0] == "batch_size"


def test_eval_while_training_skips_the_step_being_sealed(trained, tmp_path, caplog):
    """The newest step without a manifest is damaged -- unless a live trainer is about to seal it."""
    import logging

    from foldax.train.checkpointing import MANIFEST, WorkdirLock

    workdir = _copy_run(trained, tmp_path)
    shutil.copytree(workdir / "checkpoints" / "10", workdir / "checkpoints" / "20")
    (workdir / "checkpoints" / "20" / MANIFEST).unlink()
    caplog.set_level(logging.INFO, logger="foldax.train")
    with WorkdirLock(str(workdir)):
        restored = trainer.restore_for_inference(str(workdir), "latest")
        restored.manager.close()
    assert restored.step == 10 and "step 20 is still being written by the running trainer" in caplog.text
    assert "damaged checkpoint" not in caplog.text
    caplog.clear()
    restored = trainer.restore_for_inference(str(workdir), "latest")
    restored.manager.close()
    assert restored.step == 10
    assert f"damaged checkpoint step 20 ({workdir}/checkpoints/20): {MANIFEST} is missing" in caplog.text


def _orphaned_failure(kind: str, text: str) -> None:
    """A ``kind`` (Future, Task or _GatheringFuture) failed with ``ValueError(text)`` and garbage-collected
    unretrieved, as Orbax's write futures are after a failed save: asyncio logs it from ``__del__``."""
    import asyncio
    import gc

    async def fail():
        raise ValueError(text)

    async def make():
        if kind == "Future":
            future = asyncio.get_running_loop().create_future()
            future.set_exception(ValueError(text))
            return future
        return asyncio.ensure_future(fail()) if kind == "Task" else asyncio.gather(fail())

    loop = asyncio.new_event_loop()
    try:
        future = loop.run_until_complete(make())
        loop.run_until_complete(asyncio.wait([future]))
        del future
        gc.collect()
    finally:
        loop.close()


def test_orphaned_orbax_futures_are_one_line_then_silent_after_a_checkpoint_error(caplog, monkeypatch):
    import logging
    import sys

    from foldax.train.checkpointing import CheckpointError

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    orbax_error = 'RESOURCE_EXHAUSTED: Error writing "x" at "/tmp/run/checkpoints/20.orbax-checkpoint-tmp/d/1"'
    kinds = ("Future", "Task", "_GatheringFuture")
    asyncio_logger = logging.getLogger("asyncio")
    before = list(asyncio_logger.filters)

    def reports():
        return [r for r in caplog.records if "exception was never retrieved" in r.getMessage()]

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with trainer._orbax_errors_in_one_line():
            for kind in kinds:
                _orphaned_failure(kind, orbax_error)
            _orphaned_failure("Future", "not a checkpoint")
        shortened, other = reports()[:3], reports()[3:]
        assert [r.getMessage().split(" ")[0] for r in shortened] == list(kinds)
        assert all(r.exc_info is None and "\n" not in r.getMessage() for r in shortened)
        assert len(other) == 1 and other[0].exc_info is not None  # anything else keeps its traceback
        assert asyncio_logger.filters == before  # removed after a run that ended well

        caplog.clear()
        try:
            with pytest.raises(CheckpointError), trainer._orbax_errors_in_one_line():
                raise CheckpointError("could not write the checkpoint of step 20")
            for kind in kinds:
                _orphaned_failure(kind, orbax_error)
            assert reports() == []
            _orphaned_failure("Task", "not a checkpoint")
            assert len(reports()) == 1
        finally:
            asyncio_logger.filters[:] = before
            logging.getLogger("absl").filters[:] = [f for f in logging.getLogger("absl").filters
                                                    if not isinstance(f, trainer._OrbaxErrorsInOneLine)]
