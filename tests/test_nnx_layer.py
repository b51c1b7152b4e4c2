"""Tests for layers.nnx_layer: InsideLayer (NNX) and its Linen form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import layers
from layers.nnx_layer import InsideLayer, LinenInsideLayer

CHUNKS = 4  # fast compiles; results do not depend on it


def batch(seqs=("GGGAAACCC", "ACGUAGCUAGCAUCG", "GCAU")):
    return layers.encode_batch(list(seqs), buckets=None)


def test_reexported_from_layers():
    assert layers.InsideLayer is InsideLayer and layers.LinenInsideLayer is LinenInsideLayer
    assert "InsideLayer" in layers.__all__


def test_random_init_matches_init_params():
    layer = InsideLayer(rngs=nnx.Rngs(params=7), init_scale=0.3)
    want = layers.init_params(nnx.Rngs(params=7).params(), scale=0.3)
    for k, v in layer.params_dict().items():
        np.testing.assert_array_equal(v, want[k])
    assert all(isinstance(getattr(layer, k), nnx.Param) for k in ("stack", "pair", "unpaired", "loop"))


def test_init_from_arrays_and_errors():
    given = {k: np.asarray(v) for k, v in layers.default_params().items()}
    layer = InsideLayer(params=given)
    for k, v in layer.params_dict().items():
        np.testing.assert_array_equal(v, given[k])
        assert v.dtype == jnp.float32
    assert InsideLayer(params="default").params_dict()["loop"] == -3.0
    with pytest.raises(ValueError, match="rngs"):
        InsideLayer()
    with pytest.raises(ValueError, match="shape"):
        InsideLayer(params={**given, "pair": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="min_hairpin"):
        InsideLayer(params=given, min_hairpin=-1)


@pytest.mark.parametrize("min_hairpin", [0, 3])
def test_equals_log_partition(min_hairpin):
    layer = InsideLayer(rngs=nnx.Rngs(0), init_scale=0.5, min_hairpin=min_hairpin, num_chunks=CHUNKS)
    tokens, lengths = batch()
    phi = 0.2 * jax.random.normal(jax.random.key(1), tokens.shape + (tokens.shape[1],))
    params = layer.params_dict()
    got = layer(tokens, lengths, phi=phi)
    kw = dict(min_hairpin=min_hairpin, num_chunks=CHUNKS)
    want = layers.log_partition(params, tokens, lengths, phi=phi, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    best = layers.max_score(params, tokens, lengths, **kw)
    np.testing.assert_allclose(layer.max_score(tokens, lengths), best, rtol=1e-6)
    single = layer(tokens[0, : lengths[0]])
    assert single.shape == ()
    np.testing.assert_allclose(single, layers.log_partition(params, tokens, lengths, **kw)[0], rtol=1e-6)


def test_grad_through_nnx_grad_and_jit():
    layer = InsideLayer(rngs=nnx.Rngs(0), num_chunks=CHUNKS)
    tokens, lengths = batch()

    def loss(model):
        return model(tokens, lengths).sum()

    grads = nnx.grad(loss)(layer)
    want = jax.grad(lambda p: layers.log_partition(p, tokens, lengths, num_chunks=CHUNKS).sum())(layer.params_dict())
    for k in want:
        np.testing.assert_allclose(grads[k][...], want[k], rtol=1e-5, atol=1e-6)
    # d logZ / d unpaired = expected unpaired counts: non-negative, summing to at most the length
    assert (np.asarray(grads["unpaired"][...]) >= 0).all()

    @nnx.jit
    def step(model):
        g = nnx.grad(loss)(model)
        nnx.update(model, jax.tree.map(lambda p, d: p - 0.1 * d, nnx.state(model, nnx.Param), g))
        return loss(model)

    before = float(loss(layer))
    after = float(step(layer))
    assert after < before  # gradient descent on log Z lowers it


class PhiModel(nn.Module):
    """A small Linen model: an embedding and a Dense give phi, the inside layer gives log Z."""

    @nn.compact
    def __call__(self, tokens, lengths):
        emb = nn.Embed(5, 8)(tokens)
        left = nn.Dense(8, name="left")(emb)
        right = nn.Dense(8, name="right")(emb)
        phi = jnp.einsum("bid,bjd->bij", left, right) / 8.0
        return LinenInsideLayer(min_hairpin=3, num_chunks=CHUNKS, name="inside")(tokens, lengths, phi=phi), phi


def test_linen_form_init_apply_grad_jit():
    tokens, lengths = batch()
    model = PhiModel()
    variables = model.init(jax.random.key(0), tokens, lengths)
    inside = variables["params"]["inside"]
    assert {k: jnp.shape(v) for k, v in inside.items()} == {k: v for k, v in layers.inside.PARAM_SHAPES.items()}
    logz, phi = model.apply(variables, tokens, lengths)
    want = layers.log_partition(dict(inside), tokens, lengths, phi=phi, num_chunks=CHUNKS)
    np.testing.assert_allclose(logz, want, rtol=1e-6)
    jitted, _ = jax.jit(model.apply)(variables, tokens, lengths)
    np.testing.assert_allclose(jitted, logz, rtol=1e-6)

    grads = jax.jit(jax.grad(lambda v: model.apply(v, tokens, lengths)[0].sum()))(variables)
    want_g = jax.grad(lambda p: layers.log_partition(p, tokens, lengths, phi=phi, num_chunks=CHUNKS).sum())(dict(inside))
    for k in want_g:
        np.testing.assert_allclose(grads["params"]["inside"][k], want_g[k], rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(grads["params"]["left"]["kernel"]).sum()) > 0  # phi's network is trained too


def test_linen_form_from_given_params_and_max_score():
    tokens, lengths = batch()
    layer = LinenInsideLayer(params=layers.default_params(), num_chunks=CHUNKS)
    variables = layer.init(jax.random.key(0), tokens, lengths)
    np.testing.assert_array_equal(variables["params"]["pair"], layers.default_params()["pair"])
    np.testing.assert_allclose(
        layer.apply(variables, tokens, lengths),
        layers.log_partition(layers.default_params(), tokens, lengths, num_chunks=CHUNKS),
        rtol=1e-6,
    )
    best = layer.apply(variables, tokens, lengths, method=lambda m, *a: m.max_score(*a))
    np.testing.assert_allclose(best, layers.max_score(layers.default_params(), tokens, lengths, num_chunks=CHUNKS), rtol=1e-6)
