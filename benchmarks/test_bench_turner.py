"""The Turner benchmark's throughput run saves values that ``--check`` holds to ViennaRNA.

That pair is how an accelerator's float32 numbers are checked (BENCHMARKS.md, "GPU and TPU"),
so the check must pass on true values and fail on wrong ones.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "bench_turner.py"


def bench(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_throughput_values_pass_the_check_and_a_wrong_one_fails(tmp_path):
    saved = tmp_path / "run.json"
    run = bench("--section", "throughput", "--sizes", "37", "--batches", "2", "--repeats", "1",
                "--json", str(saved))
    assert run.returncode == 0, run.stderr
    result = json.loads(saved.read_text())
    assert [row["batch"] for row in result["rows"]] == [2]
    assert result["rows"][0]["pair_probs_s"] > 0 and result["rows"][0]["value_and_grad_s"] > 0
    assert len(result["checks"][0]["sequences"]) == 2  # the first 8, of a batch of 2

    good = bench("--check", str(saved))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "n=37: 2 sequences" in good.stdout

    assert "pair probabilities of 2" in good.stdout

    energies = list(result["checks"][0]["ensemble_free_energy"])
    result["checks"][0]["ensemble_free_energy"][1] *= 1.001  # 1e-3 relative: past the float32 target
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(result))
    bad = bench("--check", str(wrong))
    assert bad.returncode != 0
    assert "n=37" in bad.stderr and "above the float32 target" in bad.stderr

    result["checks"][0]["ensemble_free_energy"] = energies
    result["checks"][0]["pair_probs"][1][0][36] += 0.01  # one pair probability, 1e-2 off
    wrong.write_text(json.dumps(result))
    bad = bench("--check", str(wrong))
    assert bad.returncode != 0
    assert "pair probabilities" in bad.stderr and "above the float32 target" in bad.stderr
