"""Tests for layers.structure: structure_score and log_prob against the brute force."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax import layers
from foldax.layers.dotbracket import StructureError, from_dot_bracket, pairs_from_table, table_from_pairs, validate_pair_table
from foldax.layers.reference import enumerate_structures, random_params, reference_log_partition, structure_score_reference
from foldax.layers.structure import log_prob, structure_score


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("h", [0, 1, 3])
def test_score_matches_reference_and_probs_sum_to_one(h):
    rng = np.random.default_rng(h)
    for n in (0, 1, 2, 5, 9):
        params = random_params(rng)
        x = rng.integers(0, 5, n)
        phi = rng.normal(size=(n, n))
        structs = list(enumerate_structures(n, h))
        tables = np.stack([table_from_pairs(s, n) for s in structs])
        # All structures of one sequence as a batch (and one by one for a few).
        batch = lambda a: np.broadcast_to(a, (len(structs),) + a.shape)
        scores = structure_score(params, batch(x), tables, phi=batch(phi), min_hairpin=h)
        expected = [structure_score_reference(params, x, s, phi=phi) for s in structs]
        np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)
        for s, t in list(zip(structs, tables))[:3]:
            single = structure_score(params, x, t, phi=phi, min_hairpin=h)
            assert single.shape == () and abs(float(single) - structure_score_reference(params, x, s, phi=phi)) < 1e-12
        if n == 9:  # log_prob compiles the engine once per shape: one size is enough
            lp = log_prob(params, batch(x), tables, phi=batch(phi), min_hairpin=h)
            assert abs(float(jnp.sum(jnp.exp(lp))) - 1.0) < 1e-10


def test_padding_is_ignored():
    rng = np.random.default_rng(1)
    params = random_params(rng)
    seqs = ["GGGAAACCC", "GCAUGC", "", "ACGUACGUAGCUAGCU"]
    structs = ["(((...)))", "(....)", "", "((....))..(....)"]
    L = 20
    tokens = rng.integers(0, 5, (len(seqs), L))  # garbage beyond each length
    tables = rng.integers(-1, L, (len(seqs), L))
    phi = rng.normal(size=(len(seqs), L, L))
    lengths = np.array([len(s) for s in seqs])
    for b, (seq, st) in enumerate(zip(seqs, structs)):
        tokens[b, : len(seq)] = layers.encode(seq)
        tables[b, : len(st)] = from_dot_bracket(st)
    got = structure_score(params, tokens, tables, lengths, phi=phi)
    got_lp = log_prob(params, tokens, tables, lengths, phi=phi)
    for b, (seq, st) in enumerate(zip(seqs, structs)):
        n = len(seq)
        x, pairs, f = layers.encode(seq), from_dot_bracket(st), phi[b, :n, :n]
        expected = structure_score_reference(params, x, pairs_from_table(pairs), phi=f)
        assert got[b] == pytest.approx(expected, abs=1e-12)
        assert got_lp[b] == pytest.approx(expected - reference_log_partition(params, x, phi=f), abs=1e-10)
    assert got[2] == 0.0 and got_lp[2] == 0.0


def test_gradients_are_feature_counts():
    """The score is linear in params and phi: the gradient is the feature-count vector."""
    rng = np.random.default_rng(2)
    params = random_params(rng)
    x = layers.encode("GGGAGCAAAGCACCC")
    pt = from_dot_bracket("(((.((...))))).")
    phi = jnp.asarray(rng.normal(size=(15, 15)))
    g_params, g_phi = jax.grad(lambda p, f: structure_score(p, x, pt, phi=f), argnums=(0, 1))(params, phi)
    total = sum(jnp.vdot(g_params[k], params[k]) for k in params) + jnp.vdot(g_phi, phi)
    assert float(total) == pytest.approx(float(structure_score(params, x, pt, phi=phi)), abs=1e-12)
    expected_phi = np.zeros((15, 15))
    for i, j in [(0, 13), (1, 12), (2, 11), (4, 10), (5, 9)]:
        expected_phi[i, j] = 1
    np.testing.assert_array_equal(g_phi, expected_phi)
    assert float(g_params["loop"]) == 2 and float(jnp.sum(g_params["stack"])) == 3
    assert float(jnp.sum(g_params["unpaired"])) == 5 and float(jnp.sum(g_params["pair"])) == 5


def test_jit_and_vmap():
    rng = np.random.default_rng(3)
    params = random_params(rng)
    x = layers.encode("GGGAAACCCA")
    tables = np.stack([from_dot_bracket(s) for s in ["(((...))).", "..........", "((.....)).", "(........)"]])
    eager = structure_score(params, np.broadcast_to(x, tables.shape), tables)
    jitted = jax.jit(lambda t: structure_score(params, x, t))
    np.testing.assert_allclose(jax.vmap(jitted)(jnp.asarray(tables)), eager, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(lambda t: log_prob(params, x, t))(jnp.asarray(tables)),
                               log_prob(params, np.broadcast_to(x, tables.shape), tables), rtol=1e-12)


# (table, reason) on "GGGAAACC" with min_hairpin = 3
INVALID = [
    ([4, 5, -1, -1, 0, 1, -1, -1], "crossing"),
    ([5, -1, -1, -1, -1, 1, -1, -1], "asymmetric"),
    ([3, -1, -1, 0, -1, -1, -1, -1], "short_hairpin"),
    ([9, -1, -1, -1, -1, -1, -1, -1], "out_of_range"),
    ([-2, -1, -1, -1, -1, -1, -1, -1], "out_of_range"),
    ([0, -1, -1, -1, -1, -1, -1, -1], "self_pair"),
]


@pytest.mark.parametrize("table, reason", INVALID)
def test_invalid_table_raises_when_concrete(table, reason):
    params = random_params(np.random.default_rng(4))
    x = layers.encode("GGGAAACC")
    with pytest.raises(StructureError, match="invalid pair table") as info:
        structure_score(params, x, np.array(table))
    assert info.value.reason == reason and info.value.position is not None
    with pytest.raises(ValueError, match="invalid pair table") as info:
        log_prob(params, x, np.array(table))
    assert info.value.reason == reason


def test_invalid_tables_under_jit_give_minus_inf_and_zero_gradients():
    params = random_params(np.random.default_rng(4))
    tables = jnp.array([t for t, _ in INVALID] + [[7, -1, -1, -1, -1, -1, -1, 0]], jnp.int32)
    tokens = jnp.broadcast_to(layers.encode("GGGAAACC"), tables.shape)

    @jax.jit
    def scores_and_grads(params, tables):
        def total(p):
            s, lp = structure_score(p, tokens, tables), log_prob(p, tokens, tables)
            invalid = jnp.arange(len(tables)) < len(INVALID)
            return jnp.sum(jnp.where(invalid, s, 0) + jnp.where(invalid, lp, 0)), (s, lp)

        return jax.grad(total, has_aux=True)(params)

    grads, (s, lp) = scores_and_grads(params, tables)
    assert np.all(np.isneginf(s[:-1])) and np.all(np.isneginf(lp[:-1]))
    assert np.isfinite(s[-1]) and np.isfinite(lp[-1])
    for g in jax.tree.leaves(grads):
        assert np.all(np.asarray(g) == 0)


def test_error_names_sequence_and_partner_beyond_length():
    params = random_params(np.random.default_rng(5))
    tokens = np.zeros((3, 8), np.int32)
    tables = np.full((3, 8), -1, np.int32)
    tables[1, [0, 6]] = [6, 0]  # fine for length 8, but sequence 1 has length 6
    with pytest.raises(StructureError, match=r"sequence 1 \(length 6\).*position 0 has partner 6"):
        structure_score(params, tokens, tables, np.array([8, 6, 8]))
    assert np.isneginf(jax.jit(structure_score)(params, tokens, tables, jnp.array([8, 6, 8]))[1])


def test_traced_validity_matches_validate_pair_table():
    """The O(L) jit-side check agrees with layers.dotbracket on random (mostly invalid) tables."""
    rng = np.random.default_rng(6)
    n, h, count = 9, 2, 3000
    tables = []
    for _ in range(count):
        kind = rng.integers(3)
        if kind == 0:  # random matchings: crossing and short pairs common
            perm = rng.permutation(n)[: 2 * rng.integers(0, n // 2 + 1)]
            tables.append(table_from_pairs(zip(perm[::2], perm[1::2]), n))
        elif kind == 1:  # nested structures, one entry possibly corrupted
            structs = list(enumerate_structures(n, h))
            t = table_from_pairs(structs[rng.integers(len(structs))], n)
            if rng.random() < 0.5:
                t[rng.integers(n)] = rng.integers(-2, n + 1)
            tables.append(t)
        else:
            tables.append(rng.integers(-1, n, n).astype(np.int32))
    tables = np.stack(tables)

    def ok(t):
        try:
            validate_pair_table(t, min_hairpin=h)
            return True
        except StructureError:
            return False

    expected = np.array([ok(t) for t in tables])
    assert 0.1 < expected.mean() < 0.9
    params = random_params(rng)
    tokens = jnp.asarray(rng.integers(0, 5, tables.shape))
    got = jax.jit(lambda t: structure_score(params, tokens, t, min_hairpin=h))(jnp.asarray(tables))
    np.testing.assert_array_equal(np.isfinite(got), expected)
