"""Tests for train/familyfold.py: family-fold cross-validation on a tiny ArchiveII-like TSV.

The TSV (:func:`write_archiveii_tsv`) has the columns of ``shared/data/archiveii/archiveii.tsv``
and three families (``5s``, ``tRNA``, ``srp``) of random sequences with random nested
structures (canonical pairs), each family with rows in every random split, plus the
quirks the evaluation must account for: a held-out row longer than the training cap
(evaluated at full length), a row outside the family lists and a row with a hairpin
shorter than 3 (both left out by the data filter).
"""

import csv
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from foldax.data.examples import split_of
from foldax.layers.dotbracket import from_dot_bracket
from foldax.train import familyfold as ff
from foldax.train import train as trainer
from foldax.train.main import load_config_file

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {"A": "U", "U": "AG", "G": "CU", "C": "G"}
COLUMNS = ("id", "family", "length", "sequence", "dot_bracket", "pseudoknot", "pairs", "nested_dot_bracket",
           "n_pk_removed", "n_short_hairpin", "in_lis", "dup_of", "random_split")
#: family -> [(wanted random split, length, in_lis, short hairpin)]
ROWS = {
    "5s": [("train", 40, True, False)] * 3 + [("valid", 44, True, False), ("test", 36, True, False)],
    "tRNA": [("train", 38, True, False)] * 3 + [("valid", 42, True, False), ("test", 90, True, False),
                                               ("train", 34, False, False), ("train", 30, True, True)],
    "srp": [("train", 46, True, False)] * 2 + [("valid", 40, True, False), ("valid", 32, True, False)],
}
LONG_TRNA = 90  # > the training cap of the tests' config (64 nt)


def _structure(rng, n: int, short_hairpin: bool) -> str:
    """A random nested dot-bracket of length n: one or two stems (hairpins >= 3, or one of 2)."""
    db = ["."] * n
    loop = 2 if short_hairpin else int(rng.integers(3, 7))
    stem = int(rng.integers(3, 6))
    start = int(rng.integers(0, max(1, n - 2 * stem - loop - 12)))
    for k in range(stem):
        db[start + k], db[start + 2 * stem + loop - 1 - k] = "(", ")"
    end = start + 2 * stem + loop
    if n - end >= 14:
        s2 = end + int(rng.integers(1, 3))
        for k in range(4):
            db[s2 + k], db[s2 + 11 - k] = "(", ")"
    return "".join(db)


def _sequence(rng, db: str, split: str) -> str:
    """Canonical pairs on the structure; redrawn until its hash split (data.examples.split_of) is ``split``."""
    table = from_dot_bracket(db)
    while True:
        seq = list(rng.choice(list("ACGU"), len(db)))
        for i, j in enumerate(table):
            if j > i:
                seq[j] = str(rng.choice(list(PAIRS[seq[i]])))
        seq = "".join(seq)
        if split_of(seq) == split:
            return seq


def write_archiveii_tsv(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        for family, rows in ROWS.items():
            for k, (split, n, listed, short) in enumerate(rows):
                db = _structure(rng, n, short)
                seq = _sequence(rng, db, split)
                table = from_dot_bracket(db)
                pairs = " ".join(f"{i + 1}-{j + 1}" for i, j in enumerate(table) if j > i)
                writer.writerow([f"{family}_{k}", family, n, seq, db, 0, pairs, db, 0, int(short), int(listed), "",
                                 split])
    return path


def tiny_config(tsv: Path, **changes):
    """configs/tiny.py on the tiny TSV: training rows <= 64 nt, one bucket of 64, a few steps."""
    config = load_config_file(str(ROOT / "configs" / "tiny.py"))
    config.data.path = str(tsv)
    config.data.max_length = config.data.max_eval_length = 64
    config.data.buckets = config.data.eval_buckets = (64,)
    config.data.max_train_examples = config.data.max_valid_examples = config.data.max_test_examples = 0
    config.batch_size, config.eval_batch_size = 4, 8
    config.num_train_steps = 4
    config.optimizer.warmup_steps = 1
    config.eval_every = config.checkpoint_every = 2
    config.decoders = ("mea", "best")
    config.progress_bar = False
    config.model.num_chunks = 1  # fewer static chunks compile faster
    for key, value in changes.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    return write_archiveii_tsv(tmp_path_factory.mktemp("data") / "archiveii.tsv")


@pytest.fixture(scope="module")
def run(tsv, tmp_path_factory):
    """Family folds of tRNA and 5s: (workdir, result, calls to train_and_evaluate)."""
    workdir = str(tmp_path_factory.mktemp("ff"))
    calls = []
    real = trainer.train_and_evaluate

    def spy(config, fdir):
        calls.append((config.data.fold, fdir))
        return real(config, fdir)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "train_and_evaluate", spy)
        result = ff.familyfold(tiny_config(tsv), workdir, families=["tRNA", "5s"], config_name="tiny",
                               cross_check=True)
    return workdir, result, calls


# ---------------------------------------------------------------------------- tests


def test_extra_buckets_and_family_config():
    assert ff.extra_buckets((64, 512), [30, 512]) == ()
    assert ff.extra_buckets((64, 512), [513, 640, 641, 1024, 1025, 2968]) == (640, 768, 1024, 1280, 3072)
    base = tiny_config("unused.tsv")
    cfg = ff.family_config(base, "grp2", test_lengths=[619, 780], max_batch_cells=2**22)
    assert cfg.data.fold == "grp2" and cfg.data.max_eval_length == 780
    assert tuple(cfg.data.eval_buckets) == (64, 640, 896)
    assert cfg.eval_batch_size == 2**22 // 896**2 == 5  # the largest evaluation batch fits the cap
    assert (cfg.data.max_length, tuple(cfg.data.buckets), cfg.num_train_steps) == (64, (64,), 4)  # training as given
    assert base.data.fold == "tRNA" and tuple(base.data.eval_buckets) == (64,)  # the input is not changed
    capped = ff.family_config(base, "grp2", test_lengths=[619, 780], max_eval_length=700)
    assert capped.data.max_eval_length == 700 and tuple(capped.data.eval_buckets) == (64, 640)
    assert capped.eval_batch_size == 8


def test_held_out_family_never_in_training_or_validation(run, tsv):
    workdir, result, calls = run
    from foldax.train.datasets import load_splits

    assert [fold for fold, _ in calls] == ["tRNA", "5s"]
    for family in ("tRNA", "5s"):
        record = result["families"][family]
        saved = trainer.load_config(os.path.join(workdir, family))  # what the family's training run used
        assert saved.data.fold == family
        splits = load_splits(saved.data, min_hairpin=3, seed=0)
        assert {ex["family"] for ex in splits["test"]} == {family}
        assert family not in {ex["family"] for s in ("train", "valid") for ex in splits[s]}
        assert record["checks"]["valid_families"] == sorted({"5s", "tRNA", "srp"} - {family})
        assert record["checks"]["test_sequences_in_train_or_valid"] == 0
        assert (record["n_train"], record["n_valid"]) == (len(splits["train"]), len(splits["valid"]))
    # the validation split that picks the best checkpoint: only the other families' valid rows
    saved = trainer.load_config(os.path.join(workdir, "tRNA"))
    valid = load_splits(saved.data, min_hairpin=3, seed=0)["valid"]
    assert sorted(ex["id"] for ex in valid) == ["5s_3", "srp_2", "srp_3"]


def test_tables_and_json(run, tsv):
    workdir, result, _ = run
    saved = json.loads((Path(workdir) / "familyfold.json").read_text())
    assert saved["families_missing"] == ["srp", "tmRNA", "RNaseP", "grp1", "16s", "telomerase", "23s", "grp2"]
    assert not saved["complete"] and saved["model"] == "stacking"
    have_rnafold = saved["families"]["tRNA"]["rnafold_status"] == "ok"
    methods = {"mea", "best"} | ({"rnafold"} if have_rnafold else set())
    trna, fives = saved["families"]["tRNA"], saved["families"]["5s"]
    # tRNA: 5 listed rows without short hairpins, the 90-nt one included (full length); 2 left out
    assert trna["n_seqs"] == 5 and trna["max_length"] == LONG_TRNA and trna["n_family_rows"] == 7
    assert trna["left_out"] == {"not_listed": 1, "short_hairpin": 1}
    assert trna["max_eval_length"] == LONG_TRNA and trna["eval_buckets"] == [64, 128]
    assert fives["n_seqs"] == 5 and fives["left_out"] == {} and fives["eval_buckets"] == [64]
    assert {len(s["f1"]) for s in trna["sequences"]} == {len(methods)}
    for record in (trna, fives):
        assert set(record["methods"]) == methods
        for m in methods:
            values = record["methods"][m]
            assert values["n_seqs"] == record["n_seqs"]
            assert 0.0 <= values["f1"] <= values["f1_slip"] <= 1.0 and -1.0 <= values["mcc"] <= 1.0
            per_seq = [s["f1"][m] for s in record["sequences"]]
            assert values["f1"] == pytest.approx(np.mean(per_seq), abs=1e-4)  # per-sequence means
        # the same model, data and metric as the training run's own test evaluation
        assert record["methods"]["mea"]["f1"] == pytest.approx(record["checks"]["summary_test_mea_f1"], abs=1e-5)
        assert record["training"]["steps"] == 4 and record["step"] == record["training"]["best_step"]
    for m in methods:  # mean over families, every family weighing the same; pooled by sequences
        for key in ("f1", "f1_slip", "mcc", "precision", "recall"):
            assert saved["mean"][m][key] == pytest.approx((trna["methods"][m][key] + fives["methods"][m][key]) / 2)
            assert saved["pooled"][m][key] == pytest.approx((5 * trna["methods"][m][key] + 5 * fives["methods"][m][key])
                                                           / 10)
    md = (Path(workdir) / "familyfold.md").read_text()
    assert md == ff.format_markdown(saved) + "\n"
    assert f"| tRNA | 5 | 38-{LONG_TRNA} |" in md  # not the unlisted 34-nt row, nor the 30-nt short-hairpin one
    assert f"at full length (longest here: {LONG_TRNA} nt, tRNA)" in md
    assert "rows of at most 64 nt" in md and "**Incomplete:** 2 of 10 families" in md
    assert trna["left_out_longest"] == {"not_listed": 34, "short_hairpin": 30}
    assert "1 not in ArchiveII's family lists (up to 34 nt); 1 with a hairpin < min_hairpin (up to 30 nt)" in md
    assert "**mean of 2 families**" in md
    assert "on the validation rows of the training families only" in md  # no data.valid_families here
    aside = json.loads(json.dumps(saved))
    aside["config"]["data"]["valid_families"] = "auto"
    assert "a family set aside for validation, neither trained on nor held out (`data.valid_families = 'auto'`)" \
        in ff.format_markdown(aside)
    mea = f"{saved['mean']['mea']['f1']:.3f}"
    assert f"**{mea}**" in md
    if have_rnafold:
        assert f"RNAfold {saved['families']['tRNA']['rnafold']}" in md and "MEA - RNAfold" in md


def test_rnafold_results_are_cached(run, monkeypatch):
    RNA = pytest.importorskip("RNA")
    workdir, result, _ = run
    cache_path = Path(workdir) / "rnafold_cache.jsonl"
    lines = [json.loads(line) for line in cache_path.read_text().splitlines()]
    sequences = {s for fam in ("tRNA", "5s") for s in _evaluated_sequences(workdir, fam)}
    assert {line["sha256"] for line in lines} == {hashlib.sha256(s.encode()).hexdigest() for s in sequences}
    for line in lines:
        assert line["rnafold"] == RNA.__version__ and len(line["structure"]) == line["length"]
    assert result["families"]["tRNA"]["rnafold_cache"] == {"hits": 0, "misses": 5}
    # evaluating again folds nothing: every structure comes from the cache, and they are RNAfold's
    monkeypatch.setattr(RNA, "fold", lambda seq: pytest.fail("RNAfold called despite the cache"))
    from foldax.train.compare import RnafoldCache, compare

    cache = RnafoldCache(str(cache_path), RNA)
    for seq in sequences:
        assert cache.fold(seq) == next(x["structure"] for x in lines
                                       if x["sha256"] == hashlib.sha256(seq.encode()).hexdigest())
    fdir = os.path.join(workdir, "tRNA")
    again = compare(fdir, config=trainer.load_config(fdir), rnafold_cache=str(cache_path))
    assert again["rnafold_cache"] == {"hits": 5, "misses": 0}
    assert again["methods"]["rnafold"] == result["families"]["tRNA"]["methods"]["rnafold"]


def _evaluated_sequences(workdir, family):
    from foldax.train.datasets import load_splits

    return [ex["sequence"] for ex in load_splits(trainer.load_config(os.path.join(workdir, family)).data,
                                                  min_hairpin=3, seed=0)["test"]]


def test_a_run_killed_during_evaluation_resumes_without_training(run, tsv, monkeypatch):
    """Killed after 5s's training finished but before its evaluation was written (and while RNAfold's
    cache was being appended): the rerun trains nothing, folds nothing and gives the same record."""
    workdir, result, _ = run
    result_path = Path(workdir) / "5s" / ff.RESULT_NAME
    record = json.loads(result_path.read_text())
    result_path.unlink()
    cache_path = Path(workdir) / "rnafold_cache.jsonl"
    if cache_path.exists():
        with open(cache_path, "a") as fh:
            fh.write('{"sha256": "0123", "len')  # a torn last line
        RNA = pytest.importorskip("RNA")
        monkeypatch.setattr(RNA, "fold", lambda seq: pytest.fail("RNAfold called despite the cache"))
    monkeypatch.setattr(trainer, "train_and_evaluate", lambda *a: pytest.fail("a finished family was retrained"))
    again = ff.familyfold(tiny_config(tsv), workdir, families=["tRNA", "5s"])
    redone = again["families"]["5s"]
    assert redone["methods"] == record["methods"] and redone["sequences"] == record["sequences"]
    assert redone["rnafold_cache"] in (None, {"hits": 5, "misses": 0})
    assert again["families"]["tRNA"] == result["families"]["tRNA"]  # read back as it was
    assert again["mean"] == result["mean"]


def test_resume_skips_finished_families_and_finishes_a_half_trained_one(run, tsv, tmp_path, monkeypatch):
    """A run stopped in the middle of a family's training resumes it from its checkpoint and keeps the
    finished families; the result equals the uninterrupted run's."""
    workdir0, result0, _ = run
    workdir = str(tmp_path / "ff")
    config = tiny_config(tsv)
    # first run: tRNA finishes; 5s is stopped after step 2 (a SIGTERM as the trainer sees it)
    checks = {"n": 0}
    real_requested = trainer._Preemption.requested

    def requested(self):
        checks["n"] += 1
        return checks["n"] == 4 + 2 or real_requested(self)

    monkeypatch.setattr(trainer._Preemption, "requested", requested)
    first = ff.familyfold(config, workdir, families=["tRNA", "5s"], config_name="tiny")
    assert first["status"] == "preempted" and list(first["families"]) == ["tRNA"]
    summary = json.loads((Path(workdir) / "5s" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["steps"] == 2
    assert not (Path(workdir) / "5s" / ff.RESULT_NAME).exists()
    monkeypatch.setattr(trainer._Preemption, "requested", real_requested)

    calls = []
    real = trainer.train_and_evaluate
    monkeypatch.setattr(trainer, "train_and_evaluate", lambda c, d: calls.append(c.data.fold) or real(c, d))
    second = ff.familyfold(config, workdir, families=["tRNA", "5s"], config_name="tiny")
    assert calls == ["5s"] and second["status"] == "finished"
    assert second["families"]["5s"]["training"]["resumed_from_step"] == 2
    # without cross_check (the default) the training runs leave the held-out family to familyfold
    assert "summary_test_mea_f1" not in second["families"]["5s"]["checks"]
    assert not any(k.startswith("test/") for k in json.loads((Path(workdir) / "5s" / "summary.json").read_text()))
    for family in ("tRNA", "5s"):
        for m, values in result0["families"][family]["methods"].items():
            for key, value in values.items():
                got = second["families"][family]["methods"][m][key]
                assert got == (pytest.approx(value, abs=1e-6) if isinstance(value, float) else value), (family, m, key)
    # a rerun with nothing left to do trains nothing and gives the same tables
    calls.clear()
    third = ff.familyfold(config, workdir, families=["tRNA", "5s"], config_name="tiny")
    assert calls == [] and third["mean"] == second["mean"]


def test_a_rerun_with_another_config_is_refused(run, tsv):
    workdir, _, _ = run
    with pytest.raises(ValueError, match=r"num_train_steps: 4 -> 5.*new --workdir"):
        ff.familyfold(tiny_config(tsv, num_train_steps=5), workdir, families=["tRNA"])
    with pytest.raises(ValueError, match=r"option max_eval_length: 0 -> 60"):
        ff.familyfold(tiny_config(tsv), workdir, families=["tRNA"], max_eval_length=60)
    # fields that do not change a fold's result may change (or be new since the run started)
    path = Path(workdir) / "familyfold_config.json"
    saved = path.read_text()
    try:
        older = json.loads(saved)
        del older["config"]["eval_test"]
        del older["config"]["data"]["max_train_rows_per_family"]  # absent in runs older than the field
        path.write_text(json.dumps(older))
        again = tiny_config(tsv)
        again.progress_bar = not again.progress_bar
        assert ff.familyfold(again, workdir, families=["tRNA"])["families"]["tRNA"]
        # ... unless the new field is set to something the old run did not do
        with pytest.raises(ValueError, match=r"data.max_train_rows_per_family: 0 -> 2"):
            ff.familyfold(tiny_config(tsv, **{"data.max_train_rows_per_family": 2}), workdir, families=["tRNA"])
    finally:
        path.write_text(saved)


def test_training_rows_capped_per_family(tsv):
    from foldax.train.checkpointing import config_changes
    from foldax.train.datasets import _cap_per_family, load_splits

    def train_split(cap, fold="srp"):
        return load_splits(tiny_config(tsv, **{"data.fold": fold, "data.max_train_rows_per_family": cap}).data,
                           min_hairpin=3, seed=0)

    def counts(examples):
        return {f: sum(ex["family"] == f for ex in examples) for f in sorted({ex["family"] for ex in examples})}

    full, capped = train_split(0), train_split(2)
    assert counts(full["train"]) == {"5s": 4, "tRNA": 3}
    assert counts(capped["train"]) == {"5s": 2, "tRNA": 2}
    ids = [ex["id"] for ex in capped["train"]]
    assert set(ids) < {ex["id"] for ex in full["train"]} and ids == sorted(ids)  # a subset, in order
    assert "at most 2 rows per family (5s 4 -> 2, tRNA 3 -> 2)" in capped.sources["train"]
    assert "per family" not in full.sources["train"]
    assert [ex["id"] for ex in capped["valid"]] == [ex["id"] for ex in full["valid"]]  # training rows only
    assert counts(train_split(4)["train"]) == counts(full["train"])  # no family above the cap: all kept
    assert ids == [ex["id"] for ex in train_split(2)["train"]]  # seeded
    # a family keeps the same rows whichever other families are there
    rows = [{"id": f"{f}{k}", "family": f} for f in ("a", "b") for k in range(20)]
    both, _ = _cap_per_family(rows, 5, seed=0)
    alone, note = _cap_per_family(rows[:20], 5, seed=0)
    assert [r["id"] for r in both if r["family"] == "a"] == [r["id"] for r in alone]
    assert note == "; at most 5 rows per family (a 20 -> 5)"
    assert _cap_per_family(rows, 0, seed=0) == (rows, "")
    with pytest.raises(ValueError, match="max_train_rows_per_family must be >= 0"):
        _cap_per_family(rows, -1, seed=0)
    # a run saved before the field existed did what 0 does: resuming it is no config change
    assert config_changes({"data": {}}, {"data": {"max_train_rows_per_family": 0}}) == []
    assert config_changes({"data": {}}, {"data": {"max_train_rows_per_family": 2}}) == [
        ("data.max_train_rows_per_family", 0, 2)]


def test_bad_requests_are_clear_errors(tsv, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown families"):
        ff.familyfold(tiny_config(tsv), str(tmp_path / "a"), families=["trna"])
    with pytest.raises(ValueError, match="'grp1' has no rows"):
        ff.familyfold(tiny_config(tsv), str(tmp_path / "b"), families=["grp1"])
    files = tiny_config(tsv)
    files.data.train_files = str(tsv)
    with pytest.raises(ValueError, match="data.source = 'archiveii'"):
        ff.familyfold(files, str(tmp_path / "c"))
    assert ff.main(["--workdir", str(tmp_path / "d")]) == 1
    assert "give --config" in capsys.readouterr().err
    assert ff.main(["--workdir"]) == 2


@pytest.mark.slow
def test_command_line_max_eval_length(tsv, tmp_path, capsys):
    """`foldax familyfold` with --max-eval-length: the long tRNA is left out, and the table says so."""
    from foldax.cli import main as foldax_main

    config = ROOT / "configs" / "tiny.py"
    workdir = tmp_path / "ff"
    args = ["familyfold", "--config", str(config), "--workdir", str(workdir), "--families", "tRNA",
            "--max-eval-length", "64", "--no-rnafold", f"--config.data.path={tsv}", "--config.num_train_steps=2",
            "--config.data.max_train_examples=0", "--config.data.max_valid_examples=0",
            "--config.data.max_test_examples=0", "--config.batch_size=4", "--config.eval_every=2",
            "--config.progress_bar=false", "--config.data.buckets=(64,)", "--config.data.eval_buckets=(64,)",
            "--config.data.max_length=64"]
    assert foldax_main(args) == 0
    out = capsys.readouterr().out
    result = json.loads((workdir / "familyfold.json").read_text())
    trna = result["families"]["tRNA"]
    assert trna["n_seqs"] == 4 and trna["max_length"] < LONG_TRNA
    assert trna["left_out"] == {"not_listed": 1, "longer_than_max_eval_length": 1, "short_hairpin": 1}
    assert set(trna["methods"]) == {"mea", "best"} and trna["rnafold_status"] == "skipped"
    assert "held-out sequences up to 64 nt" in out and f"1 longer than 64 nt (up to {LONG_TRNA} nt)" in out
    assert "## F1 (mean per sequence)" in out and "wrote" in out
    assert result["config_name"].startswith(str(config))
    # resuming needs only the workdir
    assert foldax_main(["familyfold", "--workdir", str(workdir), "--families", "tRNA", "--max-eval-length", "64",
                        "--no-rnafold"]) == 0
    assert json.loads((workdir / "familyfold.json").read_text())["mean"] == result["mean"]


def test_foldax_familyfold_help(capsys):
    from foldax.cli import main as foldax_main

    assert foldax_main(["--help"]) == 0
    assert "familyfold" in capsys.readouterr().out
    assert foldax_main(["familyfold", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max-eval-length" in out and "--families" in out and "--no-rnafold" in out
    assert "--config.a.b=value" in out  # overrides, as foldax train takes them
    assert foldax_main(["familyfold", "--config", "x.py"]) == 2  # --workdir is required
