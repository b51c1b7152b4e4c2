"""Tests for train/compare.py: a trained run's held-out F1 next to RNAfold's (ViennaRNA, when installed)."""

import json
from pathlib import Path

import numpy as np
import pytest

from train import compare
from train import train as trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run (configs/tiny.py on random .dbn data, 10 steps): (workdir, summary)."""
    from test_train import small_config, write_dataset

    dataset = write_dataset(tmp_path_factory.mktemp("data"), sizes=(("train", 48), ("valid", 8), ("test", 12)))
    workdir = str(tmp_path_factory.mktemp("run"))
    summary = trainer.train_and_evaluate(small_config(dataset, num_train_steps=10), workdir)
    return workdir, summary


def test_foldax_rows_match_eval(run, capsys):
    workdir, summary = run
    assert compare.main(["--workdir", workdir, "--no-rnafold"]) == 0
    out = capsys.readouterr().out
    assert "foldax MEA (gamma 1)" in out and "foldax best structure" in out
    assert "RNAfold: skipped" in out and "F1 +-1" in out
    result = json.loads((Path(workdir) / "compare.json").read_text())
    assert result["split"] == "test" and result["step"] == summary["best_step"]
    assert result["n_seqs"] == summary["test/n_seqs"] == 12 and len(result["sequences"]) == 12
    assert set(result["methods"]) == {"mea", "best"} and result["rnafold"] is None
    for method in result["methods"].values():
        assert method["n_seqs"] == 12
        for key in ("f1", "f1_slip", "precision", "recall", "precision_slip", "recall_slip"):
            assert 0.0 <= method[key] <= 1.0
        assert method["f1_slip"] >= method["f1"]
    # the same predictions and scores as the run's own test evaluation
    assert result["methods"]["mea"]["f1"] == pytest.approx(summary["test/mea/f1"], abs=1e-5)
    assert result["methods"]["mea"]["f1_slip"] == pytest.approx(summary["test/mea/f1_slip"], abs=1e-5)


def test_without_viennarna(run, capsys, monkeypatch):
    workdir, _ = run
    monkeypatch.setattr(compare, "_load_rnafold", lambda: None)
    assert compare.main(["--workdir", workdir, "--split", "valid", "--checkpoint", "latest"]) == 0
    out = capsys.readouterr().out
    assert "ViennaRNA is not installed (pip install viennarna)" in out
    result = json.loads((Path(workdir) / "compare_valid.json").read_text())
    assert result["rnafold_status"] == "not installed" and set(result["methods"]) == {"mea", "best"}
    assert result["step"] == 10 and result["n_seqs"] == 8


def test_rnafold_row(run, capsys):
    RNA = pytest.importorskip("RNA")
    workdir, _ = run
    assert compare.main(["--workdir", workdir]) == 0
    out = capsys.readouterr().out
    assert f"RNAfold {RNA.__version__}" in out and "per sequence, F1 of foldax MEA vs RNAfold" in out
    result = json.loads((Path(workdir) / "compare.json").read_text())
    rnafold = result["methods"]["rnafold"]
    assert rnafold["n_seqs"] == 12 and 0.0 <= rnafold["f1"] <= rnafold["f1_slip"] <= 1.0
    assert all("rnafold" in s["f1"] for s in result["sequences"])


def test_rnafold_tables():
    RNA = pytest.importorskip("RNA")
    tables = compare._rnafold_tables(RNA, ["GGGGAAACCCC", "ggggaaaccTT"], 12)
    assert tables.shape == (2, 12)
    assert tables[0].tolist() == [10, 9, 8, 7, -1, -1, -1, 3, 2, 1, 0, -1]
    assert (tables[:, 11] == -1).all()


def test_no_checkpoint_is_a_clear_error(run, tmp_path, capsys):
    assert compare.main(["--workdir", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert "config.json" in err and "train a model first" in err
    empty = tmp_path / "empty"  # a config but no checkpoint yet
    empty.mkdir()
    (empty / "config.json").write_text((Path(run[0]) / "config.json").read_text())
    assert compare.main(["--workdir", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint" in err and "train a model first" in err


def test_fold_with_a_training_workdir_prints_only_structures(run, capsys):
    """`foldax fold --params WORKDIR` exports the best checkpoint's scores and keeps stdout clean."""
    import layers
    from foldax.cli import main as foldax_main

    workdir, _ = run
    assert foldax_main(["fold", "--params", workdir, "GGGGAAACCCC"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [">seq1", "GGGGAAACCCC"] and len(lines) == 3
    params = trainer.export_params(workdir, str(Path(workdir) / "exported.npz"))
    loaded = dict(np.load(params))
    expected = float(layers.max_score(loaded, layers.encode("GGGGAAACCCC")))
    assert float(lines[2].rsplit("(", 1)[1].rstrip(")")) == pytest.approx(expected, abs=0.006)
