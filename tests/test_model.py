"""Tests for model/: metrics, the CLL loss, the models (NNX and Linen) and decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from foldax import layers
from foldax.layers.dotbracket import from_dot_bracket
from foldax.model import (
    LinenNeuralPhiModel,
    NeuralPhiModel,
    StackingModel,
    cll_loss,
    cll_step,
    create_model,
    eval_sums,
    finalize,
    pair_metrics,
)

CHUNKS = 4

SEQS = ["GGGAAACCCAGGGAAACCCU", "GCGCAAAAGCGC", "ACGUACGUAC"]
DBNS = ["(((...)))..(((...))).", "((((....))))", ".........."]


def make_batch(seqs=SEQS, dbns=DBNS, width=None, extra_rows=0):
    width = width or max(map(len, seqs))
    n = len(seqs) + extra_rows
    tokens = np.full((n, width), layers.PAD_TOKEN, np.int32)
    table = np.full((n, width), -1, np.int32)
    lengths = np.zeros(n, np.int32)
    weights = np.zeros(n, np.float32)
    for b, (s, d) in enumerate(zip(seqs, dbns)):
        d = d[: len(s)]
        tokens[b, : len(s)] = layers.encode(s)
        table[b, : len(s)] = from_dot_bracket(d)
        lengths[b] = len(s)
        weights[b] = 1.0
    return {"tokens": tokens, "lengths": lengths, "pair_table": table, "weights": weights}


# --------------------------------------------------------------------- metrics


def _pairs(table, n):
    return {(i, int(j)) for i, j in enumerate(table[:n]) if j > i}


def _reference_metrics(pred, true, n):
    P, T = _pairs(pred, n), _pairs(true, n)

    def near(p, S):
        i, j = p
        return any(q in S for q in [(i, j), (i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)])

    def prf(tp_p, tp_t):
        prec = tp_p / len(P) if P else 1.0
        rec = tp_t / len(T) if T else 1.0
        return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)

    exact = len(P & T)
    return prf(exact, exact) + prf(sum(near(p, T) for p in P), sum(near(t, P) for t in T))


def _random_table(rng, n):
    table = -np.ones(n, np.int64)
    stack = []
    for i in range(n):  # random nested structure
        r = rng.random()
        if r < 0.3:
            stack.append(i)
        elif r < 0.6 and stack and i - stack[-1] > 3:
            j = stack.pop()
            table[i], table[j] = j, i
    return table


def test_metrics_against_reference_implementation():
    rng = np.random.default_rng(0)
    n_rows, width = 40, 30
    pred = np.stack([_random_table(rng, width) for _ in range(n_rows)])
    true = np.stack([_random_table(rng, width) for _ in range(n_rows)])
    true[5] = -1  # empty reference
    pred[6] = -1  # empty prediction
    pred[7], true[7] = -1, -1  # both empty
    lengths = rng.integers(20, width + 1, n_rows)
    lengths[7] = width
    pred = np.where(np.arange(width) < lengths[:, None], pred, -1)
    pred = np.where(pred < lengths[:, None], pred, -1)
    pred = np.where(pred[np.arange(n_rows)[:, None], np.maximum(pred, 0)] == np.arange(width), pred, -1)
    true = np.where(true < lengths[:, None], true, -1)
    true = np.where(true[np.arange(n_rows)[:, None], np.maximum(true, 0)] == np.arange(width), true, -1)
    got = pair_metrics(pred, true, lengths)
    names = ["precision", "recall", "f1", "precision_slip", "recall_slip", "f1_slip"]
    for b in range(n_rows):
        want = _reference_metrics(pred[b], true[b], lengths[b])
        np.testing.assert_allclose([float(got[k][b]) for k in names], want, rtol=1e-6, err_msg=f"row {b}")
    assert float(got["f1"][7]) == 1.0 and float(got["f1"][6]) == 0.0


def test_metrics_slip_examples():
    n = np.array([13])
    ref = from_dot_bracket("(((.....)))..")[None]
    shifted = from_dot_bracket(".(((.....))).")[None]  # every (i, j) -> (i + 1, j + 1): not a slip
    m = pair_metrics(ref, ref, n)
    assert all(float(m[k][0]) == 1.0 for k in m)
    m = pair_metrics(shifted, ref, n)
    assert float(m["f1"][0]) == 0.0 and float(m["f1_slip"][0]) == 0.0
    true = from_dot_bracket("((((....))))")[None]
    n = np.array([12])
    moved = true.copy()  # pairs (0, 11) and (1, 10) -> one pair (0, 10)
    moved[0, 0], moved[0, 11], moved[0, 1], moved[0, 10] = 10, -1, -1, 0
    m = pair_metrics(moved, true, n)
    # predicted pairs: (0,10) (2,9) (3,8): (0,10) is a slip of (0,11) and of (1,10)
    assert float(m["precision"][0]) == pytest.approx(2 / 3)
    assert float(m["precision_slip"][0]) == 1.0
    assert float(m["recall"][0]) == pytest.approx(2 / 4) and float(m["recall_slip"][0]) == 1.0


# ------------------------------------------------------------------------ loss


def test_cll_loss_is_nll_per_nucleotide():
    model = StackingModel(rngs=nnx.Rngs(0), init_scale=0.5, num_chunks=CHUNKS)
    batch = make_batch()
    loss, aux = cll_loss(model, batch)
    lp = layers.log_prob(model.inside.params_dict(), batch["tokens"], batch["pair_table"], batch["lengths"],
                         num_chunks=CHUNKS)
    want = -float(lp.sum()) / sum(map(len, SEQS))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert float(aux["n_tokens"]) == sum(map(len, SEQS)) and float(aux["n_seqs"]) == 3
    assert int(aux["n_invalid"]) == 0
    # padding rows and a wider bucket change nothing
    padded, _ = cll_loss(model, make_batch(width=32, extra_rows=2))
    np.testing.assert_allclose(float(padded), float(loss), rtol=1e-5)
    # L2 over all params
    with_l2, _ = cll_loss(model, batch, l2=0.01)
    l2 = sum(float(jnp.sum(v ** 2)) for v in model.inside.params_dict().values())
    np.testing.assert_allclose(float(with_l2), float(loss) + 0.01 * l2, rtol=1e-5)


def test_cll_loss_counts_invalid_targets_under_jit():
    model = StackingModel(rngs=nnx.Rngs(0), num_chunks=CHUNKS)
    batch = make_batch(["GGGAACCC"], ["(((..)))"])  # hairpin of 2 < min_hairpin 3
    loss, aux = nnx.jit(cll_loss)(model, batch)
    assert int(aux["n_invalid"]) == 1 and not np.isfinite(float(loss))


def test_stacking_model_learns_with_optax():
    model = StackingModel(rngs=nnx.Rngs(0), num_chunks=CHUNKS)
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    batch = make_batch()
    losses = [float(cll_step(model, optimizer, batch)[0]) for _ in range(15)]
    assert losses[-1] < 0.7 * losses[0]
    before = float(cll_loss(model, batch)[0])
    loss, aux = cll_step(model, optimizer, batch, l2=0.01)  # the loss before this step's update
    assert float(aux["data_loss"]) == pytest.approx(before, rel=1e-6) and float(loss) > before
    assert float(aux["grad_norm"]) > 0


# ---------------------------------------------------------------------- models


def test_neural_model_starts_as_stacking_model_and_trains():
    model = NeuralPhiModel(rngs=nnx.Rngs(0), num_chunks=CHUNKS, features=8, pair_features=4, kernel_size=3)
    batch = make_batch()
    params, phi = model.scores(batch["tokens"], batch["lengths"])
    assert phi.shape == (3, 20, 20) and float(jnp.abs(phi).max()) == 0.0  # zero-initialised head
    stacking = StackingModel(params=params, num_chunks=CHUNKS)
    np.testing.assert_allclose(float(cll_loss(model, batch)[0]), float(cll_loss(stacking, batch)[0]), rtol=1e-6)

    optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    losses = [float(cll_step(model, optimizer, batch)[0]) for _ in range(10)]
    assert losses[-1] < losses[0]
    _, phi = model.scores(batch["tokens"], batch["lengths"])
    assert float(jnp.abs(phi).max()) > 0  # the encoder is being trained
    # padding never changes a result: a wider bucket gives the same log Z
    wide = make_batch(width=32)
    np.testing.assert_allclose(model(wide["tokens"], wide["lengths"]), model(batch["tokens"], batch["lengths"]),
                               rtol=1e-5)
    assert model.scores(batch["tokens"][0, :20])[1].shape == (20, 20)


def test_linen_neural_model():
    model = LinenNeuralPhiModel(features=8, pair_features=4, kernel_size=3, num_chunks=CHUNKS)
    batch = make_batch()
    variables = model.init(jax.random.key(0), batch["tokens"], batch["lengths"], batch["pair_table"])
    assert set(variables["params"]["inside"]) == {"stack", "pair", "unpaired", "loop"}
    out = model.apply(variables, batch["tokens"], batch["lengths"], batch["pair_table"])
    inside = dict(variables["params"]["inside"])
    np.testing.assert_allclose(
        out["log_z"], layers.log_partition(inside, batch["tokens"], batch["lengths"], phi=out["phi"],
                                           num_chunks=CHUNKS), rtol=1e-6)
    np.testing.assert_allclose(
        out["score"], layers.structure_score(inside, batch["tokens"], batch["pair_table"], batch["lengths"],
                                             phi=out["phi"]), rtol=1e-6)

    def loss_fn(v):
        o = model.apply(v, batch["tokens"], batch["lengths"], batch["pair_table"])
        return jnp.sum(o["log_z"] - o["score"]) / jnp.sum(batch["lengths"])

    tx = optax.adam(0.05)
    opt_state = tx.init(variables)

    @jax.jit
    def step(v, s):
        loss, g = jax.value_and_grad(loss_fn)(v)
        updates, s = tx.update(g, s, v)
        return optax.apply_updates(v, updates), s, loss

    losses = []
    for _ in range(8):
        variables, opt_state, loss = step(variables, opt_state)
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_eval_leaves_references_the_model_cannot_produce_out_of_ll():
    model = StackingModel(params="default", num_chunks=CHUNKS)
    batch = make_batch(["GGGAAACCC", "GGGAACCC"], ["(((...)))", "(((..)))"])  # the second: a hairpin of 2
    sums = nnx.jit(eval_sums, static_argnames=("decoders",))(model, batch, decoders=("best",))
    metrics = finalize(sums)
    want = float(layers.log_prob(layers.default_params(), batch["tokens"][0], batch["pair_table"][0],
                                 num_chunks=CHUNKS)) / 9
    assert metrics["n_seqs"] == 2 and metrics["n_impossible"] == 1
    np.testing.assert_allclose(metrics["ll_per_nt"], want, rtol=1e-5)
    assert "n_impossible" not in finalize(nnx.jit(eval_sums, static_argnames=("decoders",))(
        model, make_batch(), decoders=("best",)))


@pytest.mark.parametrize("name", ["stacking", "neural"])
def test_create_model(name, tmp_path):
    import ml_collections

    cfg = ml_collections.ConfigDict({"name": name, "init": "random", "init_scale": 0.1, "min_hairpin": 3,
                                     "num_chunks": CHUNKS, "features": 8, "kernel_size": 3, "num_layers": 1,
                                     "pair_features": 4})
    model = create_model(cfg, nnx.Rngs(0))
    assert isinstance(model, StackingModel if name == "stacking" else NeuralPhiModel)
    np.savez(tmp_path / "p.npz", **{k: np.asarray(v) for k, v in layers.default_params().items()})
    cfg.init = str(tmp_path / "p.npz")
    model = create_model(cfg, nnx.Rngs(0))
    np.testing.assert_array_equal(model.inside.params_dict()["stack"], layers.default_params()["stack"])
    cfg.name = "nope"
    with pytest.raises(ValueError, match="unknown model"):
        create_model(cfg, nnx.Rngs(0))


# -------------------------------------------------------------------- decoding


def test_predict_and_eval_sums():
    from foldax.layers.decoding import best_structure, mea_structure, pair_probs
    from foldax.model import predict

    model = StackingModel(params="default", num_chunks=CHUNKS)
    batch = make_batch(width=24, extra_rows=1)
    tokens, lengths = batch["tokens"], batch["lengths"]
    best = predict(model, tokens, lengths, decoder="best")
    np.testing.assert_array_equal(best, best_structure(layers.default_params(), tokens, lengths, num_chunks=CHUNKS))
    mea = predict(model, tokens, lengths, decoder="mea", gamma=2.0)
    probs = pair_probs(layers.default_params(), tokens, lengths, num_chunks=CHUNKS)
    np.testing.assert_array_equal(mea, mea_structure(probs, lengths, gamma=2.0, num_chunks=CHUNKS))
    with pytest.raises(ValueError, match="decoder"):
        predict(model, tokens, lengths, decoder="nope")

    target = dict(batch, pair_table=np.asarray(best))  # the reference is the best structure: best/f1 = 1
    sums = nnx.jit(eval_sums, static_argnames=("decoders",))(model, target, decoders=("mea", "best"))
    metrics = finalize(sums)
    assert metrics["n_seqs"] == 3 and metrics["best/f1"] == pytest.approx(1.0)
    assert 0.0 <= metrics["mea/f1_slip"] <= 1.0 and metrics["mea/f1"] <= metrics["mea/f1_slip"]
    loss, _ = cll_loss(model, target)
    assert metrics["ll_per_nt"] == pytest.approx(-float(loss), rel=1e-5)
