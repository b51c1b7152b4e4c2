"""Tests for layers.nnx_layer: InsideLayer (NNX) and its Linen form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from foldax import layers
from foldax.layers.nnx_layer import InsideLayer, LinenInsideLayer

CHUNKS = 2  # fast compiles (each chunk is a loop body XLA compiles on its own); results do not depend on it


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


# ------------------------------------------------------------------ both grammars: the methods


def _tables_equal(got, want):
    """Two parameter dicts (either grammar) hold the same values, +inf entries included."""
    assert sorted(got) == sorted(want)
    for key in want:
        if key == "special_hairpins":
            assert list(got[key]) == list(want[key])
            np.testing.assert_array_equal([got[key][s] for s in want[key]], [want[key][s] for s in want[key]])
        else:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_turner_layer_holds_every_table_as_a_finite_param():
    layer = InsideLayer(params="turner2004")
    want = layers.turner2004()
    assert layer.grammar == "turner" and layer.is_energy
    _tables_equal(layer.params_dict(), want)
    state = nnx.state(layer, nnx.Param)
    names = set(layers.energy_params.TABLE_SHAPES) | set(layers.energy_params.SCALAR_NAMES) | {"special_hairpins"}
    assert set(state) == names
    for name in names:
        value = np.asarray(getattr(layer, name)[...])
        assert isinstance(getattr(layer, name), nnx.Param) and np.isfinite(value).all(), name
    assert dict(layer.forbidden) == {"hairpin": (0, 1, 2), "bulge": (0,), "interior": (0, 1)}
    assert float(layer.hairpin[...][0]) == 0.0 and float(layer.hairpin[...][3]) == float(want["hairpin"][3])
    assert layer.special_hairpin_sequences == tuple(want["special_hairpins"])
    assert layer.special_hairpins[...].shape == (len(want["special_hairpins"]),)
    # from a mapping, from a file, float64
    _tables_equal(InsideLayer(params=want).params_dict(), want)
    assert InsideLayer(params=want, param_dtype=jnp.float64).stack[...].dtype == jnp.float64


def test_turner_layer_from_files_and_bad_tables(tmp_path):
    path = tmp_path / "t.par"
    changed = layers.turner2004()
    changed["ml_closing"] = jnp.asarray(3.4)
    layers.save_parameter_file(changed, path)
    layer = InsideLayer(params=str(path))
    _tables_equal(layer.params_dict(), layers.load_parameter_file(path))
    assert float(layer.ml_closing[...]) == pytest.approx(3.4)
    nan = dict(layers.turner2004(), int11=jnp.full((6, 6, 5, 5), jnp.nan))
    with pytest.raises(ValueError, match="int11.*NaN"):
        InsideLayer(params=nan)
    with pytest.raises(FileNotFoundError, match="nope"):
        InsideLayer(params="nope")
    with pytest.raises(TypeError, match="stacking scores"):
        InsideLayer(params="default").free_energy(layers.encode("GGGAAACCC"), "(((...)))")


def _method_calls(layer, params, tokens, lengths, phi, kw):
    """(name, layer result, functional result) for every method."""
    key = jax.random.key(3)
    table = np.asarray(layers.best_structure(params, tokens, lengths, **kw))
    probs = layers.pair_probs(params, tokens, lengths, phi=phi, **kw)
    out = [
        ("log_partition", layer(tokens, lengths, phi=phi), layers.log_partition(params, tokens, lengths, phi=phi, **kw)),
        ("max_score", layer.max_score(tokens, lengths, phi=phi), layers.max_score(params, tokens, lengths, phi=phi, **kw)),
        ("structure_score", layer.structure_score(tokens, table, lengths, phi=phi),
         layers.structure_score(params, tokens, table, lengths, phi=phi, min_hairpin=kw["min_hairpin"])),
        ("log_prob", layer.log_prob(tokens, table, lengths, phi=phi),
         layers.log_prob(params, tokens, table, lengths, phi=phi, **kw)),
        ("pair_probs", layer.pair_probs(tokens, lengths, phi=phi), probs),
        ("best_structure", layer.best_structure(tokens, lengths, phi=phi),
         layers.best_structure(params, tokens, lengths, phi=phi, **kw)),
        ("mea_structure", layer.mea_structure(tokens, lengths, phi=phi, gamma=2.0),
         layers.mea_structure(probs, lengths, gamma=2.0, **kw)),
        ("sample_structures", layer.sample_structures(key, tokens, 5, lengths, phi=phi),
         layers.sample_structures(key, params, tokens, 5, lengths, phi=phi, **kw)),
    ]
    if layer.is_energy:
        out += [("free_energy", layer.free_energy(tokens, table, lengths), layers.free_energy(params, tokens, table, lengths)),
                ("ensemble_free_energy", layer.ensemble_free_energy(tokens, lengths, phi=phi),
                 layers.ensemble_free_energy(params, tokens, lengths, phi=phi, **kw))]
    return out


@pytest.mark.parametrize("grammar", ["stacking", pytest.param("turner", marks=pytest.mark.slow)])
def test_every_method_equals_the_functional_api(grammar):
    layer = InsideLayer(params="turner2004" if grammar == "turner" else "default", num_chunks=CHUNKS)
    params = layer.params_dict()
    tokens, lengths = batch(("GGGAAACCCAUAUGCGC", "GCGCAAAAGCGCAU", "ACGUAGCU"))
    phi = 0.3 * jax.random.normal(jax.random.key(1), tokens.shape + (tokens.shape[1],))
    kw = dict(min_hairpin=3, num_chunks=CHUNKS)
    for name, got, want in _method_calls(layer, params, tokens, lengths, phi, kw):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6, err_msg=name)
    # one sequence [n] as well
    single = tokens[1, : lengths[1]]
    np.testing.assert_allclose(layer.pair_probs(single), layers.pair_probs(params, single, **kw), atol=1e-6)
    np.testing.assert_array_equal(layer.mea_structure(single), layers.mea_structure(layers.pair_probs(params, single, **kw),
                                                                                      **kw))


def test_turner_layer_log_z_equals_log_partition():
    layer = InsideLayer(params="turner2004", num_chunks=CHUNKS)
    tokens, lengths = batch(("GGGGAAACCCC", "GCGCAAAAGCGCAU"))
    want = layers.log_partition(layers.turner2004(), tokens, lengths, num_chunks=CHUNKS)
    np.testing.assert_allclose(layer(tokens, lengths), want, rtol=1e-6)
    np.testing.assert_allclose(-layers.KT * layer(tokens, lengths), layers.ensemble_free_energy(
        layers.turner2004(), tokens, lengths, num_chunks=CHUNKS), rtol=1e-6)


@pytest.mark.slow
def test_turner_layer_gradient_through_nnx_grad():
    """d log Z / d table: the functional gradient on the finite entries, exactly 0 on the +inf ones, never NaN."""
    layer = InsideLayer(params="turner2004", num_chunks=CHUNKS)
    tokens, lengths = batch(("GGGGAAACCCCAUAUGC", "GCGCAAAAGCGCAU"))
    grads = nnx.grad(lambda m: m(tokens, lengths).sum())(layer)
    want = jax.grad(lambda p: layers.log_partition(p, tokens, lengths, num_chunks=CHUNKS).sum())(layers.turner2004())
    for name in layer.param_names:
        got = np.asarray(grads[name][...])
        assert np.isfinite(got).all(), name
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name, entries in layer.forbidden:
        assert (np.asarray(grads[name][...]).reshape(-1)[list(entries)] == 0).all()
    special = np.asarray(grads["special_hairpins"][...])
    np.testing.assert_allclose(special, [want["special_hairpins"][s] for s in layer.special_hairpin_sequences],
                               rtol=1e-4, atol=1e-7)


def test_linen_turner_layer_parameters_without_running_the_dp():
    layer = LinenInsideLayer(params="turner2004", num_chunks=CHUNKS)
    variables = layer.init(jax.random.key(0), method=lambda m: m.params_dict())
    inside = variables["params"]
    assert set(inside) == set(layers.nnx_layer.TURNER_PARAM_NAMES) | {"special_hairpins"}
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(inside))
    tables = layer.apply(variables, method=lambda m: m.params_dict())
    _tables_equal(tables, layers.turner2004())
    # a changed parameter shows in the tables the methods use
    moved = jax.tree.map(lambda x: x, variables)
    moved["params"]["ml_base"] = jnp.asarray(1.25)
    assert float(layer.apply(moved, method=lambda m: m.params_dict())["ml_base"]) == 1.25


@pytest.mark.parametrize("grammar", ["stacking", pytest.param("turner", marks=pytest.mark.slow)])
def test_linen_form_methods(grammar):
    tokens, lengths = batch(("GGGGAAACCCC", "GCGCAAAAGCGCAU"))
    spec = "turner2004" if grammar == "turner" else "default"
    layer = LinenInsideLayer(params=spec, num_chunks=CHUNKS)
    variables = layer.init(jax.random.key(0), tokens, lengths)
    params = layers.load_params(spec)
    kw = dict(min_hairpin=3, num_chunks=CHUNKS)
    probs = layer.apply(variables, tokens, lengths, method=lambda m, *a: m.pair_probs(*a))
    np.testing.assert_allclose(probs, layers.pair_probs(params, tokens, lengths, **kw), atol=1e-6)
    best = layer.apply(variables, tokens, lengths, method=lambda m, *a: m.best_structure(*a))
    np.testing.assert_array_equal(best, layers.best_structure(params, tokens, lengths, **kw))
    mea = layer.apply(variables, tokens, lengths, method=lambda m, *a: m.mea_structure(*a, gamma=1.5))
    np.testing.assert_array_equal(mea, layers.mea_structure(probs, lengths, gamma=1.5, **kw))
    key = jax.random.key(4)
    samples = layer.apply(variables, key, tokens, 3, lengths, method=lambda m, *a: m.sample_structures(*a))
    np.testing.assert_array_equal(samples, layers.sample_structures(key, params, tokens, 3, lengths, **kw))
    if grammar == "turner":
        g = layer.apply(variables, tokens, lengths, method=lambda m, *a: m.ensemble_free_energy(*a))
        np.testing.assert_allclose(g, layers.ensemble_free_energy(params, tokens, lengths, **kw), rtol=1e-6)
        e = layer.apply(variables, tokens, best, lengths, method=lambda m, *a: m.free_energy(*a))
        np.testing.assert_allclose(e, layers.free_energy(params, tokens, best, lengths), rtol=1e-6)
