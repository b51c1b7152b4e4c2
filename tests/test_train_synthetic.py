"""Recovery (slow): trained on ~2,000 sequences with structures sampled from known teacher
parameters, the learned model's held-out log-likelihood per nucleotide is within 2% of the teacher's."""

from pathlib import Path

import pytest

from foldax.train import train as trainer
from foldax.train.main import load_config_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_synthetic_recovery(tmp_path):
    config = load_config_file(str(ROOT / "configs" / "synthetic.py"))
    config.progress_bar = False
    summary = trainer.train_and_evaluate(config, str(tmp_path / "synthetic"))
    assert summary["data/train"] >= 1900
    learned, teacher = summary["test/ll_per_nt"], summary["teacher/test/ll_per_nt"]
    assert teacher < 0 and learned <= 0
    assert abs(learned - teacher) <= 0.02 * abs(teacher), (learned, teacher)
