"""Compiled programs are given back before the process runs out of memory mappings (layers/compiled.py)."""

import os
import sys

import jax
import numpy as np
import pytest

from foldax import layers
from foldax.layers import compiled
from foldax.programs import FoldPrograms, Request

linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/maps")


@linux_only
def test_releasing_unmaps_the_programs_code():
    """A Turner program holds hundreds of mappings until JAX's caches are cleared."""
    layers.release_compiled_programs()
    before = compiled.mapped_regions()
    params = layers.turner2004()
    tokens, lengths = layers.encode_batch(["GGGAAACCCAGGGAAACCCAAAGGGAAACCCU"])
    layers.pair_probs(params, tokens, lengths).block_until_ready()
    held = compiled.mapped_regions()
    assert held - before > 100
    assert layers.release_compiled_programs() is True
    assert compiled.mapped_regions() - before < (held - before) / 4


def test_high_water_is_a_share_of_the_limit():
    limit = compiled.mapping_limit()
    assert limit > 1000
    assert compiled.high_water({}) == int(compiled.HIGH_WATER_FRACTION * limit)
    assert compiled.high_water({"FOLDAX_MAPPINGS_HIGH_WATER": "0.25"}) == int(0.25 * limit)
    for bad in ("2", "0", "-0.5", "half"):
        with pytest.raises(ValueError, match=f"FOLDAX_MAPPINGS_HIGH_WATER.*{bad!r}"):
            compiled.high_water({"FOLDAX_MAPPINGS_HIGH_WATER": bad})


def test_release_if_crowded_only_when_crowded(monkeypatch):
    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    monkeypatch.setattr(compiled, "crowded", lambda: False)
    assert compiled.release_compiled_programs(if_crowded=True) is False and not cleared
    monkeypatch.setattr(compiled, "crowded", lambda: True)
    assert compiled.release_compiled_programs(if_crowded=True) is True and cleared == [1]


def test_shape_watch_checks_each_new_shape_once(monkeypatch):
    checks, released, dropped = [], [], []
    state = {"crowded": False}

    def crowded():
        checks.append(1)
        return state["crowded"]

    monkeypatch.setattr(compiled, "crowded", crowded)
    monkeypatch.setattr(compiled, "release_compiled_programs", lambda **_: released.append(1))
    watch = compiled.ShapeWatch(on_release=lambda: dropped.append(1))
    assert watch("eval", (8, 64)) is False
    assert watch("eval", (8, 64)) is False  # seen: no check
    assert len(checks) == 1
    state["crowded"] = True
    assert watch("eval", (8, 128)) is True
    assert watch("train", (8, 64)) is True  # another step's program of the same shape
    assert watch("eval", (8, 128)) is False
    assert len(checks) == 3 and released == [1, 1] and dropped == [1, 1] and watch.releases == 2


def _fold_shapes(programs, params, request):
    rng = np.random.default_rng(0)
    out = []
    for batch, length in ((1, 24), (2, 40), (1, 24)):
        tokens = rng.integers(0, 4, (batch, length))
        out.append(programs(request, params, tokens, np.full(batch, length)))
    return out


def test_fold_programs_give_programs_back_when_crowded(monkeypatch):
    """With the high-water mark at 0 every new program first releases the held ones, and the
    results stay the same (a released program is compiled again)."""
    params = layers.load_params("stacking")
    request = Request(partition=True, probs=True)
    plain = FoldPrograms(None)
    expected = _fold_shapes(plain, params, request)
    assert plain.stats["released"] == 0 and plain.stats["memory"] == 1

    monkeypatch.setattr(compiled, "high_water", lambda environ=None: 0)
    crowded = FoldPrograms(None)
    got = _fold_shapes(crowded, params, request)
    # Both new shapes and the first shape again (its program was dropped for the second).
    assert crowded.stats["released"] == 3 and crowded.stats["compiled"] == 3 and crowded.stats["memory"] == 0
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_the_command_line_reads_the_high_water_mark(tmp_path):
    """``foldax fold -i`` across length buckets with FOLDAX_MAPPINGS_HIGH_WATER set so low that it
    releases before every new program: the same output as without."""
    import subprocess

    rng = np.random.default_rng(1)
    fasta = tmp_path / "in.fa"
    fasta.write_text("".join(f">s{k}\n{''.join(rng.choice(list('ACGU'), n))}\n" for k, n in enumerate((30, 70, 150))))
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "FOLDAX_CACHE_DIR": ""}
    cmd = [sys.executable, "-m", "foldax.cli", "fold", "-p", "--params", "stacking", "-i", str(fasta)]
    plain = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    low = subprocess.run(cmd, env={**env, "FOLDAX_MAPPINGS_HIGH_WATER": "0.000001"}, capture_output=True,
                         text=True, timeout=600)
    assert low.returncode == 0, low.stderr
    assert low.stdout == plain.stdout and plain.stdout.count(">") == 3
    bad = subprocess.run(cmd, env={**env, "FOLDAX_MAPPINGS_HIGH_WATER": "lots"}, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "FOLDAX_MAPPINGS_HIGH_WATER" in bad.stderr and "Traceback" not in bad.stderr

