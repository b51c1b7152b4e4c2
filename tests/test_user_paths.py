"""A user's own data with ``foldax train``: where each split comes from, and paths that work from any directory."""

import json
import logging
import os
import re
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from foldax.data.formats import RnaRecord, write_records
from foldax.layers.dotbracket import from_dot_bracket
from foldax.train import datasets
from foldax.train import main as train_main
from foldax.train import train as trainer
from foldax.train.main import load_config_file

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.py")


def write_dbn(path, num, *, seed, prefix):
    """``num`` random hairpins (stems of 3-5 pairs, loops of 3-8) as a .dbn file."""
    rng = np.random.default_rng(seed)
    records = []
    for k in range(num):
        stem, loop, tail = int(rng.integers(3, 6)), int(rng.integers(3, 9)), int(rng.integers(0, 6))
        n = 2 * stem + loop + tail
        sequence = "".join(rng.choice(list("ACGU"), n))
        records.append(RnaRecord(f"{prefix}_{k}", sequence, from_dot_bracket("(" * stem + "." * loop + ")" * stem
                                                                             + "." * tail)))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_records(path, records)
    return path


def files_config(**files):
    config = load_config_file(TINY)
    for key, value in files.items():
        config.data[key] = value
    return config


def test_split_sizes_say_where_each_split_came_from(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    write_dbn("train.dbn", 60, seed=0, prefix="t")
    with caplog.at_level(logging.WARNING, logger="foldax.train.datasets"):
        splits = datasets.load_splits(files_config(train_files="train.dbn").data, min_hairpin=3)
    assert len(splits["train"]) + len(splits["valid"]) + len(splits["test"]) == 60
    assert splits.sources["train"] == "config.data.train_files: train.dbn, less the valid and test parts"
    for split, key in (("valid", "valid_files"), ("test", "eval_files")):
        assert "carved from config.data.train_files by sequence hash" in splits.sources[split]
        assert f"config.data.{key}" in splits.sources[split]
    line = datasets.describe_splits(splits)
    assert re.match(rf"train {len(splits['train'])} \(config.data.train_files: train.dbn, less .*\), "
                    rf"valid {len(splits['valid'])} \(carved .*\), test {len(splits['test'])} \(carved .*\)$", line)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"only {len(splits['valid'])} example" in warning and "config.data.valid_files" in warning

    caplog.clear()
    write_dbn("own/valid.dbn", datasets.SMALL_VALID + 5, seed=1, prefix="v")
    write_dbn("own/test.dbn", 7, seed=2, prefix="e")
    config = files_config(train_files="train.dbn", valid_files="own/valid.dbn", eval_files="own/test.dbn")
    with caplog.at_level(logging.WARNING, logger="foldax.train.datasets"):
        splits = datasets.load_splits(config.data, min_hairpin=3)
    cap = config.data.max_valid_examples  # tiny.py keeps 16 validation examples
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [60, cap, 7]
    assert splits.sources == {
        "train": "config.data.train_files: train.dbn",
        "valid": f"config.data.valid_files: own/valid.dbn; {cap} of {datasets.SMALL_VALID + 5} kept by "
                 f"config.data.max_valid_examples",
        "test": "config.data.eval_files: own/test.dbn"}
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"only {cap} example" in warning and "max_valid_examples" in warning

    caplog.clear()
    config.data.max_valid_examples = 0  # all of them
    config.data.max_length = 20  # and drop the longer ones
    with caplog.at_level(logging.WARNING, logger="foldax.train.datasets"):
        splits = datasets.load_splits(config.data, min_hairpin=3)
    assert len(splits["valid"]) >= datasets.SMALL_VALID
    n_long = datasets.SMALL_VALID + 5 - len(splits["valid"])
    assert n_long > 0
    assert splits.sources["valid"] == f"config.data.valid_files: own/valid.dbn; {n_long} longer than 20 dropped"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_missing_data_file_names_the_field_and_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_dbn("train.dbn", 20, seed=0, prefix="t")
    with pytest.raises(FileNotFoundError) as err:
        datasets.load_splits(files_config(train_files="tran.dbn").data, min_hairpin=3)
    assert "config.data.train_files" in str(err.value) and "'tran.dbn'" in str(err.value)
    assert str(tmp_path) in str(err.value)  # relative paths: from which directory
    with pytest.raises(FileNotFoundError, match=r"config\.data\.eval_files: .*'/nowhere/test\.dbn'"):
        datasets.load_splits(files_config(train_files="train.dbn", eval_files="/nowhere/test.dbn").data,
                             min_hairpin=3)


def test_absolute_data_paths():
    config = ml_collections.ConfigDict({
        "data": {"train_files": "a.dbn, sub/*.ct,/abs/b.bpseq", "valid_files": "", "eval_files": "../t.dbn",
                 "path": "~/archiveii", "synthetic": {"teacher": "default"}},
        "model": {"init": "runs/x/params.npz"}})
    out = datasets.absolute_data_paths(config, base="/work/here")
    assert out.data.train_files == "/work/here/a.dbn,/work/here/sub/*.ct,/abs/b.bpseq"
    assert out.data.valid_files == "" and out.data.eval_files == "/work/t.dbn"
    assert out.data.path == os.path.expanduser("~/archiveii") and out.data.synthetic.teacher == "default"
    assert out.model.init == "/work/here/runs/x/params.npz"
    assert config.data.train_files == "a.dbn, sub/*.ct,/abs/b.bpseq"  # a copy: the input is unchanged
    only = datasets.absolute_data_paths(config, fields=["data.eval_files"], base="/w")
    assert only.data.eval_files == "/t.dbn" and only.data.train_files == config.data.train_files


def test_foldax_train_stores_absolute_paths(tmp_path, monkeypatch):
    """What `foldax train` hands the trainer (and so saves as config.json): absolute data paths."""
    seen = []
    monkeypatch.setattr(trainer, "train_and_evaluate", lambda config, workdir: seen.append(config) or {})
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--config", TINY, "--workdir", "run", "--config.data.train_files=train.dbn,more/*.dbn",
            "--config.data.valid_files", "valid.dbn", "--config.model.init=init.npz"]
    assert train_main.main(argv) == 0
    data = seen[-1].data
    assert data.train_files == f"{tmp_path}/train.dbn,{tmp_path}/more/*.dbn"
    assert data.valid_files == f"{tmp_path}/valid.dbn" and data.eval_files == ""
    assert seen[-1].model.init == f"{tmp_path}/init.npz"

    # a run saved before paths were stored absolute: its paths stay as they were, new overrides are absolute
    (tmp_path / "old").mkdir()
    saved = load_config_file(TINY)
    saved.data.train_files = "train.dbn"
    (tmp_path / "old" / "config.json").write_text(saved.to_json_best_effort())
    assert train_main.main(["train", "--workdir", "old", "--config.data.eval_files=test.dbn"]) == 0
    assert seen[-1].data.train_files == "train.dbn" and seen[-1].data.eval_files == f"{tmp_path}/test.dbn"


def test_readme_own_data_example_names_all_three_splits():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "foldax train" in line and "train_files" in line]
    assert commands, "no own-data example in the README"
    fields = set(re.findall(r"--config\.data\.(\w+)=", " ".join(commands)))
    assert {"train_files", "valid_files", "eval_files"} <= fields
    assert fields <= set(load_config_file("default").data.keys())
    for key, role in (("valid_files", "validation"), ("eval_files", "test split")):
        assert any(f"`{key}`" in line and role in line.lower() for line in readme.splitlines()), key


@pytest.mark.slow
def test_train_with_relative_paths_then_eval_and_resume_elsewhere(tmp_path, monkeypatch):
    """End to end: `foldax train` on relative paths in one directory; eval and resume from another."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    write_dbn("project/data/train.dbn", 24, seed=0, prefix="t")
    write_dbn("project/data/valid.dbn", 4, seed=1, prefix="v")
    write_dbn("project/data/test.dbn", 4, seed=2, prefix="e")
    monkeypatch.chdir(project)
    settings = ["--config.data.max_length=32", "--config.data.max_eval_length=32", "--config.data.buckets=(32,)",
                "--config.data.eval_buckets=(32,)", "--config.batch_size=4", "--config.eval_batch_size=4",
                "--config.num_train_steps=2", "--config.eval_every=2", "--config.checkpoint_every=2",
                "--config.progress_bar=false"]
    assert train_main.main(["train", "--config", TINY, "--workdir", "run",
                            "--config.data.train_files=data/train.dbn", "--config.data.valid_files=data/valid.dbn",
                            "--config.data.eval_files=data/test.dbn", *settings]) == 0
    saved = json.loads((project / "run" / "config.json").read_text())["data"]
    assert saved["train_files"] == str(project / "data" / "train.dbn")

    monkeypatch.chdir(elsewhere)
    workdir = str(project / "run")
    assert train_main.main(["eval", "--workdir", workdir]) == 0
    assert json.loads((project / "run" / "eval_test.json").read_text())["n_seqs"] == 4
    assert train_main.main(["train", "--workdir", workdir, "--config.num_train_steps=3"]) == 0
    assert json.loads((project / "run" / "summary.json").read_text())["steps"] == 3
