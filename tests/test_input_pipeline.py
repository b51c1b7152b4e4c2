"""Tests for train.input_pipeline (and data.synthetic feeding it)."""

import collections
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from foldax import layers
from foldax.data.formats import RnaRecord
from foldax.layers.alphabet import PAD_TOKEN, encode
from foldax.layers.dotbracket import is_nested, table_from_pairs
from foldax.train.input_pipeline import InputPipeline, PipelineConfig, padding_stats, suggest_buckets

SHARED_TSV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "archiveii" / "archiveii.tsv"
BUCKETS = (16, 32, 64, 128)


def make_examples(num=103, seed=0, max_len=120):
    """Random nested examples of random lengths (dicts, as datasets yield them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        n = int(rng.integers(5, max_len + 1))
        seq = "".join(rng.choice(list("ACGU"), n))
        k = int(rng.integers(0, n // 4 + 1))
        pairs = [(i, n - 1 - i) for i in range(k)]  # a nested stem
        out.append({"sequence": seq, "pair_table": table_from_pairs(pairs, n)})
    return out


def config(**kw):
    base = dict(batch_size=8, buckets=BUCKETS, seed=3, num_epochs=1, shard_index=0, shard_count=1, num_threads=2)
    base.update(kw)
    return PipelineConfig(**base)


def take(iterator, n):
    return list(itertools.islice(iterator, n))


def rows_of(batches):
    return [int(i) for b in batches for i in b["example_index"] if i >= 0]


# ---------------------------------------------------------------------- batches


def test_batch_contents():
    examples = make_examples()
    pipe = InputPipeline(examples, config())
    batches = list(pipe)
    assert len(batches) == pipe.steps_per_epoch
    for b in batches:
        B, L = b["tokens"].shape
        assert B == 8 and L in BUCKETS
        assert b["tokens"].dtype == b["lengths"].dtype == b["pair_table"].dtype == np.int32
        assert b["weights"].dtype == np.float32 and b["pair_table"].shape == (B, L)
        for row in range(B):
            index, n = int(b["example_index"][row]), int(b["lengths"][row])
            if index < 0:
                assert n == 0 and b["weights"][row] == 0 and (b["pair_table"][row] == -1).all()
                continue
            ex = examples[index]
            assert n == len(ex["sequence"]) <= L and b["weights"][row] == 1
            assert np.array_equal(b["tokens"][row, :n], encode(ex["sequence"]))
            assert (b["tokens"][row, n:] == PAD_TOKEN).all()
            assert np.array_equal(b["pair_table"][row, :n], ex["pair_table"]) and (b["pair_table"][row, n:] == -1).all()


def test_epoch_covers_every_example_once_with_one_partial_batch():
    examples = make_examples()
    batches = list(InputPipeline(examples, config()))
    assert sorted(rows_of(batches)) == list(range(len(examples)))
    assert sum((b["weights"] == 0).any() for b in batches) == 1  # only the final leftover batch is partial


def test_drop_remainder():
    examples = make_examples()
    pipe = InputPipeline(examples, config(drop_remainder=True, num_epochs=3))
    batches = list(pipe)
    assert all((b["weights"] == 1).all() for b in batches)
    for b in batches:  # no leftover moved up: every row is in its own smallest bucket
        L = b["tokens"].shape[1]
        smaller = [x for x in BUCKETS if x < L]
        assert all(n > max(smaller, default=0) for n in b["lengths"])
    epochs = [rows_of(batches[e * pipe.steps_per_epoch : (e + 1) * pipe.steps_per_epoch]) for e in range(3)]
    assert len(set(map(tuple, map(sorted, epochs)))) > 1  # different examples dropped per epoch


def test_records_and_bytes_are_accepted():
    recs = [RnaRecord(f"r{i}", ex["sequence"], ex["pair_table"]) for i, ex in enumerate(make_examples(10))]
    as_bytes = [{"sequence": r.sequence.encode(), "pair_table": r.pair_table} for r in recs]
    a, b = list(InputPipeline(recs, config())), list(InputPipeline(as_bytes, config()))
    assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="example 0: example has no structure"):
        InputPipeline([RnaRecord("x", "ACGU", None)], config())
    with pytest.raises(ValueError, match="example 1: pair table length 3 != sequence length 4"):
        InputPipeline(make_examples(1) + [{"sequence": "ACGU", "pair_table": [-1, -1, -1]}], config())


# ---------------------------------------------------------------- determinism


def test_deterministic_shuffle():
    examples = make_examples()
    first = rows_of(InputPipeline(examples, config()))
    assert rows_of(InputPipeline(examples, config())) == first
    assert rows_of(InputPipeline(examples, config(seed=4))) != first
    two = list(InputPipeline(examples, config(num_epochs=2)))
    steps = len(two) // 2
    assert rows_of(two[:steps]) == first and rows_of(two[steps:]) != first
    assert sorted(rows_of(two[steps:])) == sorted(first)


def test_no_shuffle_is_sorted_by_bucket_then_input_order():
    examples = make_examples()
    batches = list(InputPipeline(examples, config(shuffle=False)))
    widths = [b["tokens"].shape[1] for b in batches]
    assert widths == sorted(widths)
    bucket = [np.searchsorted(BUCKETS, len(ex["sequence"])) for ex in examples]
    assert rows_of(batches) == sorted(range(len(examples)), key=lambda i: bucket[i])


# ------------------------------------------------------------------- over-long


def test_overlong_policies():
    examples = make_examples(max_len=120) + [{"sequence": "G" * 150 + "C" * 50,
                                              "pair_table": table_from_pairs([(0, 199), (10, 140)], 200)}]
    dropped = InputPipeline(examples, config(max_length=128))
    assert dropped.stats["n_dropped_overlong"] == 1 and len(examples) - 1 not in rows_of(dropped)
    truncated = InputPipeline(examples, config(max_length=128, overlong="truncate"))
    assert truncated.stats["n_truncated"] == 1
    [row] = [(b, r) for b in truncated for r in range(8) if b["example_index"][r] == len(examples) - 1]
    b, r = row
    assert b["lengths"][r] == 128 and (b["pair_table"][r] == -1).all()  # both pairs reach past 128
    assert is_nested(b["pair_table"][r])
    with pytest.raises(ValueError, match="example 103 has length 200 > max_length 128"):
        InputPipeline(examples, config(max_length=128, overlong="error"))


def test_config_errors():
    for bad in (dict(buckets=(32, 16)), dict(max_length=500), dict(shard_index=2, shard_count=2),
                dict(overlong="cut"), dict(batch_size=0)):
        with pytest.raises(ValueError):
            InputPipeline(make_examples(5), config(**bad))


def test_default_shards_come_from_jax():
    cfg = PipelineConfig(batch_size=4).resolved()
    assert (cfg.shard_index, cfg.shard_count) == (0, 1)


# --------------------------------------------------------------------- sharding


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_shards_are_disjoint_and_cover(drop_remainder):
    examples = make_examples(157)
    count = 3
    shards = [list(InputPipeline(examples, config(shard_index=k, shard_count=count, drop_remainder=drop_remainder)))
              for k in range(count)]
    assert len({len(s) for s in shards}) == 1  # same number of steps on every process
    for step in zip(*shards):  # same width at every step
        assert len({b["tokens"].shape for b in step}) == 1
    seen = [rows_of(s) for s in shards]
    flat = [i for s in seen for i in s]
    assert len(flat) == len(set(flat))  # disjoint
    if not drop_remainder:
        assert sorted(flat) == list(range(len(examples)))  # covering
    # the union of the shards is the single-process schedule with a 3x batch
    single = list(InputPipeline(examples, config(batch_size=24, drop_remainder=drop_remainder)))
    assert [sorted(rows_of(s)) for s in zip(*shards)] == [sorted(rows_of([b])) for b in single]


# ------------------------------------------------------------ save and restore


def test_restore_mid_epoch_gives_identical_remaining_batches():
    pipe = InputPipeline(make_examples(), config(num_epochs=3))
    assert pipe.steps_per_epoch > 7
    it = iter(pipe)
    take(it, 7)  # mid epoch 0
    state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
    rest = list(it)
    resumed = iter(InputPipeline(make_examples(), config(num_epochs=3, num_threads=1, prefetch=2)))
    resumed.set_state(state)
    again = list(resumed)
    assert len(again) == len(rest) == 3 * pipe.steps_per_epoch - 7
    for a, b in zip(rest, again):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_restore_rejects_other_pipeline():
    it = iter(InputPipeline(make_examples(), config()))
    next(it)
    state = it.get_state()
    other = iter(InputPipeline(make_examples(), config(seed=99)))
    with pytest.raises(ValueError, match="different pipeline"):
        other.set_state(state)


def test_orbax_checkpoint_round_trip(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import grain

    pipe = InputPipeline(make_examples(), config(num_epochs=None))
    it = iter(pipe)
    take(it, 20)  # into epoch 1
    manager = ocp.CheckpointManager(tmp_path)
    manager.save(20, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    want = take(it, 10)
    fresh = iter(pipe)
    manager.restore(20, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    got = take(fresh, 10)
    assert all(np.array_equal(a["example_index"], b["example_index"]) for a, b in zip(want, got))


# ---------------------------------------------------------------------- padding


def test_padding_stats_match_batches():
    pipe = InputPipeline(make_examples(), config())
    batches = list(pipe)
    real = sum(int(b["lengths"].sum()) for b in batches)
    total = sum(b["tokens"].size for b in batches)
    assert pipe.padding_stats()["token_waste"] == pytest.approx(1 - real / total)
    assert padding_stats([np.array([4, 0])], [4]) == {"token_waste": 0.5, "cubic_waste": 0.5, "padding_rows": 0.5,
                                                      "num_batches": 1}


def test_suggest_buckets_is_optimal():
    rng = np.random.default_rng(0)
    for _ in range(40):
        lengths = rng.integers(1, 100, size=int(rng.integers(1, 12)))
        k = int(rng.integers(1, 4))
        widths = -(-lengths // 8) * 8
        cand = np.unique(widths)

        def cost(buckets):
            b = np.array(sorted(buckets))
            return float((b[np.searchsorted(b, widths)] ** 2.0).sum())

        best = min(cost(list(c) + [cand[-1]]) for r in range(min(k, len(cand)))
                   for c in itertools.combinations(cand[:-1], r))
        got = suggest_buckets(lengths, k, multiple_of=8, power=2)
        assert len(got) <= k and got[-1] == cand[-1] and cost(got) == pytest.approx(best)


@pytest.mark.skipif(not SHARED_TSV.exists(), reason="shared ArchiveII TSV absent")
@pytest.mark.slow
def test_archiveii_padding_waste_at_batch_32():
    from foldax.data.archiveii import load_archiveii

    examples = load_archiveii(SHARED_TSV)
    for drop_remainder in (False, True):
        cfg = config(batch_size=32, buckets=layers.DEFAULT_BUCKETS, drop_remainder=drop_remainder)
        pipe = InputPipeline(examples, cfg)
        assert pipe.padding_stats()["token_waste"] <= 0.25


# -------------------------------------------------------------------- synthetic


def test_random_sequences():
    import jax

    from foldax.data.synthetic import random_sequences

    seqs = random_sequences(jax.random.key(0), [200, 5], base_probs=[0.7, 0.1, 0.1, 0.1])
    assert [len(s) for s in seqs] == [200, 5] and set("".join(seqs)) <= set("ACGU")
    assert collections.Counter(seqs[0])["A"] > 100
    assert seqs == random_sequences(jax.random.key(0), [200, 5], base_probs=[0.7, 0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="base_probs"):
        random_sequences(jax.random.key(0), [5], base_probs=[0.5, 0.5])


def test_synthetic_records_through_pipeline():
    import jax

    from foldax.data.synthetic import synthetic_records

    records = synthetic_records(jax.random.key(1), layers.default_params(), 6, [20, 30, 40, 20, 30, 40],
                                samples_per_sequence=2)
    assert len(records) == 12 and all(is_nested(r.pair_table) for r in records)
    batches = list(InputPipeline(records, config(batch_size=4)))
    assert sorted(rows_of(batches)) == list(range(12))


def test_synthetic_records_with_stand_in_sampler(monkeypatch):
    """Checks data.synthetic's own logic against a stand-in for the engine's sampler."""
    import jax

    from foldax.data.synthetic import synthetic_records

    calls = []

    def fake_sampler(key, params, tokens, num_samples, lengths=None, *, phi=None, min_hairpin=3):
        calls.append((tokens.shape, num_samples, min_hairpin))
        n = tokens.shape[0]
        table = table_from_pairs([(0, n - 1)] if n > min_hairpin + 1 else [], n)
        return np.stack([table] * num_samples)

    monkeypatch.setattr(layers, "sample_structures", fake_sampler, raising=False)
    records = synthetic_records(jax.random.key(0), {}, 3, 10, samples_per_sequence=2)
    assert [r.id for r in records] == [f"synthetic_{i}_{s}" for i in range(3) for s in range(2)]
    assert calls == [((10,), 2, 3)] * 3 and records[0].dot_bracket == "(........)"
    assert records[0].sequence == records[1].sequence != records[2].sequence

    monkeypatch.setattr(layers, "sample_structures", lambda *a, **k: np.array([[3, 2, 1, 0, -1]]), raising=False)
    with pytest.raises(ValueError, match="min_hairpin=3"):
        synthetic_records(jax.random.key(0), {}, 1, 5)
    with pytest.raises(ValueError, match="2 lengths given for 1 sequences"):
        synthetic_records(jax.random.key(0), {}, 1, [5, 6])


def test_synthetic_examples_compile_one_program_per_length_and_padding_changes_no_sample():
    """train.datasets.synthetic_examples pads each length's last batch to ``batch_size`` rows: one
    compiled sampler per length, and each sequence's structure is the one an unpadded call draws."""
    import jax

    from foldax.layers import decoding
    from foldax.train.datasets import synthetic_examples

    params = layers.default_params()
    before = decoding._sample._cache_size()
    examples = synthetic_examples(params, 14, [12, 16], seed=5, batch_size=4, num_chunks=1)  # 7 per length: 4 + 3
    assert decoding._sample._cache_size() - before == 2
    assert [len(ex["sequence"]) for ex in examples] == [12, 16] * 7
    sample_key = jax.random.split(jax.random.key(5))[1]
    idx = [i for i, ex in enumerate(examples) if len(ex["sequence"]) == 16]
    for start in (0, 4):  # a full batch, and the padded one against an unpadded call of its 3 rows
        rows = idx[start : start + 4]
        key = jax.random.fold_in(jax.random.fold_in(sample_key, 16), start)
        tokens = np.stack([encode(examples[i]["sequence"]) for i in rows])
        want = np.asarray(layers.sample_structures(key, params, tokens, 1, num_chunks=1))[:, 0]
        got = np.stack([np.asarray(examples[i]["pair_table"]) for i in rows])
        np.testing.assert_array_equal(got, want)
