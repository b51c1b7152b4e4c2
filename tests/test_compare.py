"""Tests for train/compare.py: a trained run's held-out F1 next to RNAfold's (ViennaRNA, when installed)."""

import json
from pathlib import Path

import numpy as np
import pytest

from foldax.train import compare
from foldax.train import train as trainer


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
    from foldax import layers
    from foldax.cli import main as foldax_main

    workdir, _ = run
    assert foldax_main(["fold", "--params", workdir, "GGGGAAACCCC"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [">seq1", "GGGGAAACCCC"] and len(lines) == 3
    params = trainer.export_params(workdir, str(Path(workdir) / "exported.npz"))
    loaded = layers.load_params(params)
    expected = float(layers.max_score(loaded, layers.encode("GGGGAAACCCC")))
    assert float(lines[2].rsplit("(", 1)[1].rstrip(")")) == pytest.approx(expected, abs=0.006)


# ------------------------------------------------------------------ MCC, cache, long batches


def _mcc_by_counting(pred, true, n):
    """Matthews' correlation over every candidate pair i < j < n, counted one by one."""
    tp = fp = fn = tn = 0
    for i in range(n):
        for j in range(i + 1, n):
            p, t = pred[i] == j, true[i] == j
            tp, fp, fn, tn = tp + (p and t), fp + (p and not t), fn + (t and not p), tn + (not p and not t)
    denom = np.sqrt(float(tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    if denom == 0:
        return 1.0 if fp == fn == 0 else 0.0
    return (tp * tn - fp * fn) / denom


def test_mcc_equals_counting_every_candidate_pair():
    from test_train import random_table

    from foldax.model.metrics import METRIC_NAMES, pair_metrics

    assert METRIC_NAMES[:6] == ("precision", "recall", "f1", "precision_slip", "recall_slip", "f1_slip")
    rng = np.random.default_rng(3)
    width, rows = 40, 12
    lengths = rng.integers(1, width + 1, rows)
    lengths[:3] = (1, 2, width)
    true = -np.ones((rows, width), np.int64)
    pred = -np.ones((rows, width), np.int64)
    for b in range(rows):
        n = int(lengths[b])
        true[b, :n] = random_table(rng, n)
        pred[b, :n] = true[b, :n] if b == 3 else random_table(rng, n)  # row 3: perfect
    pred[4], true[5], pred[6], true[6] = -1, -1, -1, -1  # empty prediction / reference / both
    true[4, :12], true[4, 12:], lengths[4] = [11, 10, 9, 8, -1, -1, -1, -1, 3, 2, 1, 0], -1, 20
    got = np.asarray(pair_metrics(pred, true, lengths)["mcc"])
    want = [_mcc_by_counting(pred[b], true[b], int(lengths[b])) for b in range(rows)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[3] == pytest.approx(1.0) and got[6] == 1.0
    assert (got[4], got[0], got[1]) == (0.0, 1.0, 1.0)  # empty pred vs pairs; one or two bases: nothing to pair


def test_mcc_of_a_long_sequence_is_near_sqrt_precision_recall():
    from test_train import random_table

    from foldax.model.metrics import pair_metrics

    rng = np.random.default_rng(0)
    n = 3000
    true = random_table(rng, n)[None]
    pred = true.copy()
    paired = np.flatnonzero(pred[0] > np.arange(n))[:200]  # drop 200 pairs
    pred[0, pred[0, paired]] = -1
    pred[0, paired] = -1
    m = {k: float(v[0]) for k, v in pair_metrics(pred, true, np.array([n])).items()}
    assert m["precision"] == 1.0 and 0 < m["recall"] < 1
    assert m["mcc"] == pytest.approx(np.sqrt(m["precision"] * m["recall"]), abs=1e-3)
    assert np.isfinite(m["mcc"])


def test_rnafold_cache_file(tmp_path, monkeypatch):
    RNA = pytest.importorskip("RNA")
    path = str(tmp_path / "cache.jsonl")
    seqs = ["GGGGAAACCCC", "GGGAAAUCCC", "ACGUACGUAGCUAGCUAGCAUGCAUCG"]
    cache = compare.RnafoldCache(path, RNA)
    folded = [cache.fold(s) for s in seqs + seqs[:1]]
    assert folded == [RNA.fold(s)[0] for s in seqs + seqs[:1]] and (cache.hits, cache.misses) == (1, 3)
    lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
    assert [x["length"] for x in lines] == [len(s) for s in seqs] and {x["rnafold"] for x in lines} == {RNA.__version__}
    with open(path, "a") as fh:  # a torn line (killed while writing) and another version's entry
        fh.write(json.dumps({**lines[0], "rnafold": "0.0", "sha256": "x"}) + '\n{"sha256": "ab')
    calls = []
    monkeypatch.setattr(RNA, "fold", lambda s: calls.append(s) or ("." * len(s), 0.0))
    again = compare.RnafoldCache(path, RNA)
    assert len(again) == 3 and [again.fold(s.lower()) for s in seqs] == folded[:3] and calls == []
    assert again.fold("GGGGAAAUCCCC") == "." * 12 and calls == ["GGGGAAAUCCCC"]  # not cached: folded


def test_capped_batches_give_the_same_metrics(run):
    """Long buckets get fewer rows under max_batch_cells; the scores stay those of the run's own test evaluation."""
    workdir, summary = run
    config = trainer.load_config(workdir)
    config.data.eval_buckets = (32, 64)
    assert compare.eval_batch_sizes((32, 64), 16, max_batch_cells=4 * 64**2) == [16, 4]
    capped = compare.compare(workdir, config=config, rnafold=False, max_batch_cells=4 * 64**2)
    assert capped["n_seqs"] == 12 and capped["n_dropped_overlong"] == 0
    for key in ("f1", "f1_slip", "mcc", "precision", "recall"):
        assert capped["methods"]["mea"][key] == pytest.approx(summary[f"test/mea/{key}"], abs=1e-5)


def test_overlong_sequences_are_counted(run):
    workdir, _ = run
    config = trainer.load_config(workdir)
    config.data.eval_buckets = (32,)
    result = compare.compare(workdir, config=config, rnafold=False)
    scored = [s["length"] for s in result["sequences"]]
    assert result["n_examples"] == 12 and result["n_seqs"] + result["n_dropped_overlong"] == 12
    assert result["n_dropped_overlong"] > 0 and max(scored) == result["max_length"] <= 32


def test_test_subset_is_the_one_training_evaluates(run):
    """With data.max_test_examples, compare scores the same subset as the run's own test evaluation."""
    from foldax.train.datasets import load_splits

    workdir, _ = run
    config = trainer.load_config(workdir)
    config.data.max_test_examples = 5
    result = compare.compare(workdir, config=config, rnafold=False)
    trained = load_splits(config.data, min_hairpin=3, seed=int(config.seed))["test"]  # as train_and_evaluate loads
    assert [s["id"] for s in result["sequences"]] == [ex["id"] for ex in trained]
