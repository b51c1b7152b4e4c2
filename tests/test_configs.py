"""Every config loads and has what the trainer reads; command-line overrides parse."""

from pathlib import Path

import ml_collections
import pytest

from foldax.train.datasets import validation_families
from foldax.train.main import _split_overrides, apply_overrides, load_config_file

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")


def test_all_configs_present():
    assert {"default.py", "tiny.py", "synthetic.py", "neural.py"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads(name):
    config = load_config_file(str(ROOT / "configs" / name))
    assert isinstance(config, ml_collections.ConfigDict)
    for field in ("seed", "batch_size", "eval_batch_size", "num_train_steps", "log_every", "eval_every",
                  "checkpoint_every", "keep_checkpoints", "decoders", "gamma", "best_metric"):
        assert field in config, f"{name}: no config.{field}"
    assert config.model.name in ("stacking", "neural", "turner", "turner_neural")
    assert config.data.source in ("archiveii", "files", "synthetic")
    for field in ("train_files", "valid_files", "eval_files", "buckets", "max_length", "short_hairpins"):
        assert field in config.data, f"{name}: no config.data.{field}"
    assert list(config.data.buckets) == sorted(config.data.buckets)
    # whole validation families (or "" for the training families' random 'valid' rows), overridable everywhere
    assert validation_families(config.data.valid_families, "5s") in ((), ("tRNA",))
    assert validation_families("srp,tRNA", "5s") == ("srp", "tRNA")
    assert config.data.max_length <= max(config.data.buckets)
    assert config.optimizer.name in ("adam", "adamw", "sgd")
    assert set(config.decoders) <= {"mea", "best"}
    metric = config.best_metric
    assert metric in ("", "ll_per_nt") or metric.split("/")[0] in config.decoders
    config.to_json_best_effort()  # saved as config.json by the trainer


def test_turner_neural_variant_is_the_turner_recipe_with_the_encoder():
    turner = load_config_file(str(ROOT / "configs" / "turner.py")).to_dict()
    neural = load_config_file(str(ROOT / "configs" / "turner.py") + ":neural").to_dict()
    assert (turner["model"].pop("name"), neural["model"].pop("name")) == ("turner", "turner_neural")
    assert (turner["optimizer"].pop("l2"), neural["optimizer"].pop("l2")) == (0.0, 0.1)  # the encoder's L2
    assert neural == turner  # same data, validation, schedule and prior: only the model and its L2 differ
    with pytest.raises(ValueError, match="unknown variant"):
        load_config_file(str(ROOT / "configs" / "turner.py") + ":nueral")


def test_overrides():
    config = load_config_file(str(ROOT / "configs" / "default.py"))
    rest, overrides = _split_overrides(
        ["train", "--config.batch_size=32", "--config.optimizer.learning_rate", "0.5", "--workdir", "w",
         "--config.data.buckets=(32, 64)", "--config.progress_bar=false", "--config.data.train_files=a.dbn,b/*.ct",
         "--config.data.valid_families=srp"]
    )
    assert rest == ["train", "--workdir", "w"]
    apply_overrides(config, overrides)
    assert config.batch_size == 32 and config.optimizer.learning_rate == 0.5
    assert tuple(config.data.buckets) == (32, 64) and config.progress_bar is False
    assert config.data.train_files == "a.dbn,b/*.ct" and config.data.valid_families == "srp"
    with pytest.raises(KeyError, match="no field"):
        apply_overrides(config, [("nope", "1")])
    with pytest.raises(ValueError):
        apply_overrides(config, [("batch_size", "many")])


def test_config_file_with_argument(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("import ml_collections\n"
                    "def get_config(arg='x'):\n    return ml_collections.ConfigDict({'arg': arg})\n")
    assert load_config_file(str(path)).arg == "x"
    assert load_config_file(f"{path}:hello").arg == "hello"
    with pytest.raises(FileNotFoundError):
        load_config_file(str(tmp_path / "missing.py"))


def test_config_names_resolve_from_any_directory(tmp_path, monkeypatch):
    """`--config tiny` and `--config configs/tiny.py` find the shipped configs outside the repository root."""
    from foldax.train.main import resolve_config_file, shipped_configs

    monkeypatch.chdir(tmp_path)
    assert {"default", "tiny", "synthetic", "neural"} <= set(shipped_configs())
    expected = load_config_file(str(ROOT / "configs" / "tiny.py")).to_dict()
    for spec in ("tiny", "tiny.py", "configs/tiny.py"):
        assert load_config_file(spec).to_dict() == expected, spec
    assert resolve_config_file("configs/tiny.py") == str(ROOT / "configs" / "tiny.py")
    (tmp_path / "configs").mkdir()  # a file of the user's own wins over a shipped name
    (tmp_path / "configs" / "tiny.py").write_text(
        "import ml_collections\ndef get_config():\n    return ml_collections.ConfigDict({'mine': 1})\n")
    assert load_config_file("configs/tiny.py").to_dict() == {"mine": 1}
    with pytest.raises(FileNotFoundError, match=r"nope.*shipped config name: .*default.*tiny"):
        load_config_file("nope")
    with pytest.raises(FileNotFoundError, match="elsewhere/tiny.py"):
        load_config_file("elsewhere/tiny.py")  # a path into another folder is not a shipped name
