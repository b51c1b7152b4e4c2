"""The expected-F1 loss (``config.loss = "expected_f1"``, :func:`foldax.model.expected_f1_loss`).

Its two expectations -- of the true positives and of the number of predicted pairs -- are
checked against brute-force enumeration over every structure, with the Turner energies of
:func:`foldax.layers.free_energy` (itself tested against ViennaRNA); its gradient against
finite differences in float64.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from foldax import layers  # noqa: E402
from foldax.layers.energy_params import KT  # noqa: E402
from foldax.layers.energy_reference import enumerate_turner_structures  # noqa: E402
from foldax.layers.dotbracket import from_dot_bracket, table_from_pairs  # noqa: E402
from foldax.model import expected_f1_loss, get_loss  # noqa: E402
from foldax.model.models import StackingModel, TurnerModel  # noqa: E402

CHUNKS = 2
SEQS = ["GGGAAACCCAGCUUCG", "GCGCAAAAGCGC", "ACGUAGCUAGCAU"]
DBNS = ["(((...)))..(...)", "((((....))))", "............."]  # the last has no pair: weight 0


def _batch(seqs=SEQS, dbns=DBNS):
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    table = np.full(tokens.shape, -1, np.int32)
    for b, d in enumerate(dbns):
        table[b, : len(seqs[b])] = from_dot_bracket(d)
    return {"tokens": tokens, "lengths": lengths, "pair_table": table, "weights": np.ones(len(seqs), np.float32)}


def _perturbed_turner(seed, scale, dtype=jnp.float64, **kwargs):
    """A Turner model whose tables moved by N(0, scale^2) from Turner 2004 (its prior's centre)."""
    model = TurnerModel(param_dtype=dtype, num_chunks=CHUNKS, **kwargs)
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    rng = np.random.default_rng(seed)
    moved = [jnp.asarray(np.asarray(x) + scale * rng.normal(size=np.shape(x)), x.dtype) for x in leaves]
    nnx.update(model, jax.tree.unflatten(tree, moved))
    return model


def _brute_force_f1(params, seq, dbn):
    """``2 E[TP] / (E[#pairs] + |R|)`` over every structure of ``seq`` (Boltzmann weights of its energy)."""
    ref = {(i, int(j)) for i, j in enumerate(from_dot_bracket(dbn)) if j > i}
    tokens = layers.encode(seq)
    structures = list(enumerate_turner_structures(seq))
    energies = np.array([float(layers.free_energy(params, tokens, table_from_pairs(s, len(seq))))
                         for s in structures])
    weights = np.exp(-(energies - energies.min()) / KT)
    p = weights / weights.sum()
    tp = sum(pi * len(ref & set(s)) for pi, s in zip(p, structures))
    n_pred = sum(pi * len(s) for pi, s in zip(p, structures))
    return 2 * tp / (n_pred + len(ref))


@pytest.mark.parametrize("dtype, rtol", [(jnp.float64, 1e-9), (jnp.float32, 2e-4)])
def test_expected_f1_equals_brute_force_expectations(dtype, rtol):
    model = _perturbed_turner(seed=1, scale=0.4, dtype=dtype)
    batch = _batch()
    loss, aux = expected_f1_loss(model, batch)
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), model.inside.params_dict())
    want = [_brute_force_f1(params64, s, d) for s, d in zip(SEQS[:2], DBNS[:2])]
    # The pair-free row has weight 0: the mean is over the two rows with reference pairs.
    np.testing.assert_allclose(float(aux["expected_f1"]), np.mean(want), rtol=rtol)
    np.testing.assert_allclose(float(aux["data_loss"]), 1 - np.mean(want), rtol=rtol * 10)
    assert float(aux["n_seqs"]) == 2 and int(aux["n_invalid"]) == 0
    np.testing.assert_allclose(float(loss), float(aux["data_loss"]), rtol=1e-6)  # no prior, no L2

    # One row at a time, and with padding and another order: the same per-row values.
    for b in range(2):
        one = {k: v[b : b + 1] for k, v in batch.items()}
        np.testing.assert_allclose(float(expected_f1_loss(model, one)[1]["expected_f1"]), want[b], rtol=rtol)
    swapped = _batch(SEQS[1::-1], DBNS[1::-1])
    np.testing.assert_allclose(float(expected_f1_loss(model, swapped)[1]["expected_f1"]), np.mean(want), rtol=rtol)


def test_row_weights_and_the_prior_enter_the_loss():
    model = TurnerModel(num_chunks=CHUNKS)
    batch = _batch()
    first_only = dict(batch, weights=np.array([1, 0, 1], np.float32))
    f1_first = float(expected_f1_loss(model, {k: v[:1] for k, v in batch.items()})[1]["expected_f1"])
    np.testing.assert_allclose(float(expected_f1_loss(model, first_only)[1]["expected_f1"]), f1_first, rtol=1e-6)
    # Moved from its prior's centre, the model's prior_penalty is added to 1 - F1.
    moved = _perturbed_turner(seed=3, scale=0.1, dtype=jnp.float32, prior_strength=0.5)
    loss, aux = expected_f1_loss(moved, batch)
    np.testing.assert_allclose(float(aux["prior"]), float(moved.prior_penalty()), rtol=1e-6)
    assert float(aux["prior"]) > 0
    np.testing.assert_allclose(float(loss), float(aux["data_loss"]) + float(aux["prior"]), rtol=1e-6)


def test_stacking_model_and_unknown_loss_names():
    model = StackingModel(params="default", num_chunks=CHUNKS)
    loss, aux = expected_f1_loss(model, _batch())
    assert 0 < float(aux["expected_f1"]) < 1 and np.isfinite(float(loss))
    assert get_loss("cll")[1] == "nll_per_nt" and get_loss("expected_f1")[1] == "expected_f1"
    with pytest.raises(ValueError, match=r"unknown config.loss 'f1'.*'cll', 'expected_f1'"):
        get_loss("f1")


@pytest.mark.slow
def test_gradient_matches_finite_differences_and_adam_raises_the_f1():
    from test_turner_model import assert_gradient_matches_finite_differences

    model = _perturbed_turner(seed=2, scale=0.2)
    batch = _batch()
    assert_gradient_matches_finite_differences(lambda m: expected_f1_loss(m, batch)[0], model, atol=1e-10)

    # Training on it raises the expected F1, and nothing becomes NaN or inf.
    model = TurnerModel(num_chunks=CHUNKS)
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        (loss, aux), g = nnx.value_and_grad(expected_f1_loss, has_aux=True)(model, batch)
        optimizer.update(model, g)
        return aux["expected_f1"]

    f1s = [float(step(model, optimizer)) for _ in range(8)]
    assert f1s[-1] > f1s[0] + 0.02 and f1s == sorted(f1s), f1s  # 0.892 -> 0.928 in 8 steps
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state((model, optimizer))))


@pytest.mark.slow
def test_training_on_expected_f1_logs_it_and_the_loss_cannot_change_on_resume(tmp_path):
    import json

    from test_turner_model import _turner_config

    from foldax.train import train as trainer
    from foldax.train.checkpointing import ConfigChanged

    config = _turner_config(loss="expected_f1", num_train_steps=3)
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    assert summary["status"] == "finished" and summary["steps"] == 3
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["train/expected_f1"] for r in rows if "train/expected_f1" in r]
    assert logged and all(0 < f <= 1 for f in logged)
    assert not any("train/nll_per_nt" in r for r in rows)
    config = _turner_config(loss="cll", num_train_steps=6)
    with pytest.raises(ConfigChanged, match=r"loss 'expected_f1' -> 'cll'"):
        trainer.train_and_evaluate(config, str(tmp_path))


def test_runs_written_before_the_loss_field_resume_as_cll():
    from foldax.train.checkpointing import config_changes

    assert config_changes({"seed": 0}, {"seed": 0, "loss": "cll"}) == []
    assert config_changes({"seed": 0}, {"seed": 0, "loss": "expected_f1"}) == [("loss", "cll", "expected_f1")]
