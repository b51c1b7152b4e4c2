"""Tests for layers.decoding and the gradients of log_partition, against brute-force enumeration.

Every engine compile costs seconds (one per shape, dtype, min_hairpin and function), so
each test packs its cases into one padded batch of a fixed shape. Most pass
``num_chunks=NC``: the automatic count is 1 chunk for L < 64, and the traceback and the
gradient readouts should also be checked across chunk boundaries.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.scipy.special import gammaincc

from foldax import layers
from foldax.layers.decoding import best_structure, mea_structure, pair_probs, sample_structures
from foldax.layers.dotbracket import pairs_from_table, table_from_pairs, validate_pair_table
from foldax.layers.reference import (
    brute_force_log_partition,
    brute_force_pair_probs,
    enumerate_structures,
    random_params,
    structure_score_reference,
)
from foldax.layers.structure import log_prob, structure_score

L = 12
NC = 3  # num_chunks for the brute-force matrix: several chunks even at L = 12


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def random_batch(rng, lengths, length=L, phi_scale=1.0):
    """Padded tokens [B, L] (garbage in the padding), lengths [B] and phi [B, L, L]."""
    tokens = rng.integers(0, 5, (len(lengths), length))
    phi = phi_scale * rng.normal(size=(len(lengths), length, length))
    return tokens, np.asarray(lengths), phi


def brute_force_best(params, x, phi, h):
    structs = list(enumerate_structures(len(x), h))
    scores = [structure_score_reference(params, x, s, phi=phi) for s in structs]
    return structs[int(np.argmax(scores))], max(scores)


def mea_objective(probs, pairs, gamma):
    paired = [b for p in pairs for b in p]
    q = 1 - probs.sum(axis=1)
    return sum(2 * gamma * probs[i, j] for i, j in pairs) + sum(q[i] for i in range(len(q)) if i not in paired)


# ----------------------------------------------------------------- pair probabilities


@pytest.mark.parametrize("scale", [1.0, 5.0])
@pytest.mark.parametrize("h", [0, 1, 3])
def test_pair_probs_match_brute_force(h, scale):
    rng = np.random.default_rng(10 * h + int(scale))
    params = random_params(rng, scale)
    tokens, lengths, phi = random_batch(rng, [12, 11, 9, h + 1, 1, 0])
    probs = np.asarray(pair_probs(params, tokens, lengths, phi=phi, min_hairpin=h, num_chunks=NC))
    for b, n in enumerate(lengths):
        x, f = tokens[b, :n], phi[b, :n, :n]
        np.testing.assert_allclose(probs[b, :n, :n], brute_force_pair_probs(params, x, phi=f, min_hairpin=h),
                                   atol=1e-11)
    assert np.all(probs[0][np.triu_indices(L, 1)] >= 0)
    np.testing.assert_array_equal(probs, np.swapaxes(probs, 1, 2))
    assert np.all(probs.sum(axis=2) <= 1 + 1e-12)
    valid = np.arange(L)[None, :] < lengths[:, None]
    assert np.all(probs[~(valid[:, :, None] & valid[:, None, :])] == 0)


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_pair_probs_float32(scale):
    rng = np.random.default_rng(7)
    params = random_params(rng, scale, np.float32)
    tokens, lengths, phi = random_batch(rng, [12, 10, 4, 0])
    probs = pair_probs(params, tokens, lengths, phi=phi.astype(np.float32), min_hairpin=3)  # default chunks
    assert probs.dtype == jnp.float32
    for b, n in enumerate(lengths):
        expected = brute_force_pair_probs(params, tokens[b, :n], phi=phi[b, :n, :n].astype(np.float32), min_hairpin=3)
        np.testing.assert_allclose(probs[b, :n, :n], expected, atol=2e-5)
    single = pair_probs(params, tokens[1, :10], phi=phi[1, :10, :10].astype(np.float32), min_hairpin=3)
    np.testing.assert_allclose(single, probs[1, :10, :10], atol=1e-6)


# ------------------------------------------------------------ gradients of log Z


@pytest.mark.parametrize("h", [0, 3])
def test_log_partition_gradients(h):
    """jax.grad(log_partition) == grad of a brute-force logsumexp == central differences."""
    rng = np.random.default_rng(20 + h)
    n = 9
    params = random_params(rng)
    x = jnp.asarray(rng.integers(0, 5, n))
    phi = jnp.asarray(rng.normal(size=(n, n)))
    log_z = lambda p, f: layers.log_partition(p, x, phi=f, min_hairpin=h, num_chunks=NC)
    grads = jax.grad(log_z, argnums=(0, 1))(params, phi)

    # A plain differentiable reference: logsumexp of structure_score over all structures.
    tables = jnp.asarray(np.stack([table_from_pairs(s, n) for s in enumerate_structures(n, h)]))
    many = lambda a: jnp.broadcast_to(a, (len(tables),) + a.shape)
    reference = lambda p, f: jax.nn.logsumexp(structure_score(p, many(x), tables, phi=many(f), min_hairpin=h))
    assert float(log_z(params, phi)) == pytest.approx(float(reference(params, phi)), rel=1e-12)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(reference, argnums=(0, 1))(params, phi))):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    # Central differences for every entry of every parameter and of phi, in one vmapped call.
    flat, unravel = ravel_pytree((params, phi))
    eps = 1e-5
    steps = eps * jnp.eye(flat.size)
    value = jax.vmap(lambda v: log_z(*unravel(v)))
    fd = (value(flat + steps) - value(flat - steps)) / (2 * eps)
    grad_flat, _ = ravel_pytree(grads)
    np.testing.assert_allclose(grad_flat, fd, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------ best structure


@pytest.mark.parametrize("h", [0, 1, 3])
def test_best_structure_matches_brute_force(h):
    rng = np.random.default_rng(30 + h)
    params = random_params(rng)
    tokens, lengths, phi = random_batch(rng, [12, 11, 10, 8, h + 1, 0])
    tables = np.asarray(best_structure(params, tokens, lengths, phi=phi, min_hairpin=h, num_chunks=NC))
    best = layers.max_score(params, tokens, lengths, phi=phi, min_hairpin=h, num_chunks=NC)
    for b, n in enumerate(lengths):
        expected, score = brute_force_best(params, tokens[b, :n], phi[b, :n, :n], h)
        assert pairs_from_table(tables[b, :n]) == sorted(expected)
        assert np.all(tables[b, n:] == -1)
        assert float(best[b]) == pytest.approx(score, abs=1e-10)
    np.testing.assert_allclose(structure_score(params, tokens, tables, lengths, phi=phi, min_hairpin=h), best,
                               atol=1e-10)


def test_best_structure_single_and_ties():
    x = layers.encode("GGGGAAACCCC")
    params = layers.default_params()
    pt = best_structure(params, x)  # default chunks
    assert layers.to_dot_bracket(pt) == "((((...))))"
    assert float(structure_score(params, x, pt)) == pytest.approx(float(layers.max_score(params, x)), abs=1e-6)
    # All-zero scores: every structure ties at 0; the engine's choice is deterministic and valid.
    zero = jax.tree.map(jnp.zeros_like, params)
    first, second = best_structure(zero, x), best_structure(zero, x)
    np.testing.assert_array_equal(first, second)
    validate_pair_table(np.asarray(first), min_hairpin=3)
    assert float(structure_score(zero, x, first)) == 0.0


# ----------------------------------------------------------------------------- MEA


@pytest.mark.parametrize("h", [0, 3])
def test_mea_matches_brute_force(h):
    rng = np.random.default_rng(40 + h)
    lengths = [10, 9, 7, h + 1, 0]
    tokens, lengths, phi = random_batch(rng, lengths, length=10)
    probs = np.zeros((len(lengths), 10, 10))
    for b, n in enumerate(lengths):
        params = random_params(rng, scale=2.0)  # a different model per row: varied probabilities
        probs[b, :n, :n] = brute_force_pair_probs(params, tokens[b, :n], phi=phi[b, :n, :n], min_hairpin=h)
    for gamma in (0.5, 1.0, 4.0):
        tables = np.asarray(mea_structure(probs, lengths, gamma=gamma, min_hairpin=h, num_chunks=NC))
        for b, n in enumerate(lengths):
            structs = list(enumerate_structures(n, h))
            values = [mea_objective(probs[b, :n, :n], s, gamma) for s in structs]
            got = pairs_from_table(tables[b, :n])
            assert mea_objective(probs[b, :n, :n], got, gamma) == pytest.approx(max(values), abs=1e-12)
            assert got == sorted(structs[int(np.argmax(values))])
            assert np.all(tables[b, n:] == -1)
    single = mea_structure(probs[1, :9, :9], min_hairpin=h, num_chunks=NC)
    np.testing.assert_array_equal(single, tables[1, :9])


# ------------------------------------------------------------------------ sampling


def chi_square_p_value(counts, probs, min_expected=5.0):
    """Pearson chi-square test of counts against probs, pooling bins expected below min_expected."""
    total = counts.sum()
    expected = probs * total
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(np.sum((obs - exp) ** 2 / exp))
    return float(gammaincc((len(obs) - 1) / 2, stat / 2)), len(obs)


@pytest.mark.parametrize("h", [pytest.param(0, marks=pytest.mark.slow), 1, pytest.param(3, marks=pytest.mark.slow)])
def test_samples_follow_boltzmann_distribution(h):
    rng = np.random.default_rng(50 + h)
    num = 20000
    params = random_params(rng)
    tokens, lengths, phi = random_batch(rng, [9, 10], length=10)
    tables = np.asarray(sample_structures(jax.random.key(0), params, tokens, num, lengths, phi=phi, min_hairpin=h,
                                          num_chunks=NC))
    assert tables.shape == (2, num, 10) and tables.dtype == np.int32
    for b, n in enumerate(lengths):
        x, f = tokens[b, :n], phi[b, :n, :n]
        assert np.all(tables[b, :, n:] == -1)
        counts = collections.Counter(tuple(pairs_from_table(t[:n])) for t in tables[b])
        for s in counts:
            validate_pair_table(table_from_pairs(s, n), min_hairpin=h)
        structs = [tuple(sorted(s)) for s in enumerate_structures(n, h)]
        assert set(counts) <= set(structs)
        log_z = brute_force_log_partition(params, x, phi=f, min_hairpin=h)
        probs = np.exp([structure_score_reference(params, x, s, phi=f) - log_z for s in structs])
        p_value, bins = chi_square_p_value(np.array([counts[s] for s in structs]), probs)
        assert bins > min(20, len(structs) // 3) and p_value > 1e-3, (b, p_value, bins)


def test_sample_single_sequence_and_jit():
    x = layers.encode("GGGGAAACCCCAUGCAUGCAU")
    params = layers.default_params()
    tables = sample_structures(jax.random.key(1), params, x, 64, min_hairpin=3)  # the data/synthetic.py call
    assert tables.shape == (64, len(x)) and tables.dtype == jnp.int32
    for t in np.asarray(tables):
        validate_pair_table(t, min_hairpin=3)
    jitted = jax.jit(lambda k: sample_structures(k, params, x, 64, min_hairpin=3))
    np.testing.assert_array_equal(jitted(jax.random.key(1)), tables)
    assert not np.array_equal(jitted(jax.random.key(2)), tables)


# ------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_edge_lengths_and_large_parameters_stay_finite(dtype):
    h = 3
    rng = np.random.default_rng(60)
    params = random_params(rng, scale=50.0 / 3, dtype=dtype)  # entries up to ~50
    params = jax.tree.map(lambda p: jnp.clip(p, -50, 50), params)
    tokens, lengths, phi = random_batch(rng, [0, 1, h, h + 1, 7, 12], phi_scale=10.0)
    phi = phi.astype(dtype)

    def loss(p, f):
        return jnp.sum(layers.log_partition(p, tokens, lengths, phi=f, min_hairpin=h, num_chunks=NC))

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(params, phi)
    assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    probs = pair_probs(params, tokens, lengths, phi=phi, min_hairpin=h, num_chunks=NC)
    assert np.all(np.isfinite(probs)) and np.all(probs >= 0) and np.all(probs.sum(axis=2) <= 1 + 1e-4)
    best = best_structure(params, tokens, lengths, phi=phi, min_hairpin=h, num_chunks=NC)
    samples = sample_structures(jax.random.key(0), params, tokens, 8, lengths, phi=phi, min_hairpin=h,
                                num_chunks=NC)
    for b, n in enumerate(lengths):
        validate_pair_table(np.asarray(best[b, :n]), min_hairpin=h)
        for t in np.asarray(samples[b]):
            validate_pair_table(t[:n], min_hairpin=h)
    lp, lp_grads = jax.value_and_grad(
        lambda p: jnp.sum(log_prob(p, tokens, best, lengths, phi=phi, min_hairpin=h, num_chunks=NC)))(params)
    assert np.isfinite(lp) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(lp_grads))
    mea = mea_structure(probs, lengths, min_hairpin=h, num_chunks=NC)
    for b, n in enumerate(lengths):
        validate_pair_table(np.asarray(mea[b, :n]), min_hairpin=h)


def test_empty_and_tiny_single_sequences():
    params = layers.default_params()
    for n in (0, 1, 3, 4):
        x = layers.encode("GAUC"[:n])
        assert pair_probs(params, x).shape == (n, n)
        assert best_structure(params, x).shape == (n,)
        assert mea_structure(jnp.zeros((n, n))).shape == (n,)
        assert sample_structures(jax.random.key(0), params, x, 5).shape == (5, n)
        g = jax.grad(lambda p: layers.log_partition(p, x))(params)
        assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(g))
