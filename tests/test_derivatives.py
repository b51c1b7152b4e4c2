"""Derivatives of the DP beyond the gradient, and transformations users compose it with.

Forward mode, Hessians, gradients of functions of pair probabilities (the outside pass
differentiated again), and jax.vmap with per-example lengths, for both grammars, checked
against central finite differences in float64 and against batched calls.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from foldax import layers
from foldax.layers.reference import brute_force_pair_probs, random_params

EPS = 1e-6


def _fd_along(fn, params, direction):
    """Central difference of fn along a direction (a pytree like params)."""
    plus = jax.tree.map(lambda a, b: a + EPS * b, params, direction)
    minus = jax.tree.map(lambda a, b: a - EPS * b, params, direction)
    return jax.tree.map(lambda p, m: (p - m) / (2 * EPS), fn(plus), fn(minus))


def _random_direction(params, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: jnp.asarray(rng.normal(size=np.shape(a)), jnp.float64), params)


def _turner_params(seed=0, scale=0.3):
    """Turner 2004 tables with a random perturbation (kcal/mol), float64 (inf entries kept)."""
    base = layers.turner2004(jnp.float64)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: jnp.where(jnp.isfinite(a), a + scale * rng.normal(size=np.shape(a)), a), base)


def _finite_direction(params, seed):
    d = _random_direction(params, seed)
    return jax.tree.map(lambda a, p: jnp.where(jnp.isfinite(p), a, 0.0), d, params)


GRAMMARS = {
    "stacking": (lambda: random_params(np.random.default_rng(1)), "GGGAACCUUCGGGAUCCA"),
    "turner": (lambda: _turner_params(), "GGGGAUACUCCGGGUAUCCCCAAGGCGCU"),
}


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_forward_mode_equals_finite_differences(grammar):
    make, seq = GRAMMARS[grammar]
    params, x = make(), layers.encode(seq)
    direction = _finite_direction(params, 2)
    value = lambda p: layers.log_partition(p, x)
    _, tangent = jax.jvp(value, (params,), (direction,))
    np.testing.assert_allclose(tangent, _fd_along(value, params, direction), rtol=1e-6, atol=1e-8)
    # and it agrees with reverse mode
    grads = jax.grad(value)(params)
    np.testing.assert_allclose(tangent, ravel_pytree(grads)[0] @ ravel_pytree(direction)[0], rtol=1e-10)


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_gradient_of_a_pair_probability_equals_finite_differences(grammar):
    """Reverse over reverse: the outside pass is differentiated again (a loss on P)."""
    make, seq = GRAMMARS[grammar]
    params, x = make(), layers.encode(seq)
    n = len(seq)
    weights = jnp.asarray(np.random.default_rng(3).normal(size=(n, n)))
    loss = lambda p: jnp.sum(weights * layers.pair_probs(p, x))
    grads = jax.grad(loss)(params)
    direction = _finite_direction(params, 4)
    along = ravel_pytree(grads)[0] @ ravel_pytree(direction)[0]
    np.testing.assert_allclose(along, _fd_along(loss, params, direction), rtol=1e-5, atol=1e-8)
    for leaf in jax.tree.leaves(grads):
        assert bool(jnp.all(jnp.isfinite(leaf)))


def test_gradient_of_pair_probs_wrt_phi_is_the_hessian_vector_product():
    params = random_params(np.random.default_rng(5))
    x = layers.encode("GGGAAACCCAUGCAUU")
    n = x.shape[0]
    phi0 = jnp.asarray(np.random.default_rng(6).normal(size=(n, n)) * 0.3)
    v = jnp.asarray(np.random.default_rng(7).normal(size=(n, n)))
    probs = lambda f: layers.pair_probs(params, x, phi=f)
    got = jax.grad(lambda f: jnp.sum(v * jnp.triu(probs(f))))(phi0)
    # d/dphi of <v, P> by finite differences, entry by entry along a random direction
    u = jnp.asarray(np.random.default_rng(8).normal(size=(n, n)))
    fd = (jnp.sum(v * jnp.triu(probs(phi0 + EPS * u))) - jnp.sum(v * jnp.triu(probs(phi0 - EPS * u)))) / (2 * EPS)
    np.testing.assert_allclose(jnp.sum(got * u), fd, rtol=1e-5)


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_hessian_is_symmetric_and_equals_finite_differences(grammar):
    make, seq = GRAMMARS[grammar]
    params, x = make(), layers.encode(seq)
    key = "unpaired" if grammar == "stacking" else "dangle3"
    table = params[key]
    value = lambda t: layers.log_partition({**params, key: t}, x)
    hess = jax.hessian(value)(table)
    flat = hess.reshape(table.size, table.size)
    np.testing.assert_allclose(flat, flat.T, atol=1e-10)
    grad = jax.grad(value)
    for k in range(0, table.size, max(1, table.size // 6)):
        e = jnp.zeros(table.size).at[k].set(1.0).reshape(table.shape)
        fd = (grad(table + EPS * e) - grad(table - EPS * e)) / (2 * EPS)
        np.testing.assert_allclose(hess.reshape(table.size, *table.shape)[k], fd, rtol=1e-5, atol=1e-7)


def test_third_derivatives_are_refused_clearly():
    params = random_params(np.random.default_rng(1))
    x = layers.encode("GGGAAACCCAUG")
    second = lambda p: jax.grad(lambda q: layers.pair_probs(q, x)[0, 8])(p)["loop"]
    with pytest.raises(Exception, match="third|Linearization"):
        jax.grad(second)(params)
    with pytest.raises(NotImplementedError, match="third"):
        jax.jvp(second, (params,), (params,))


def test_pair_probs_gradient_stays_exact_for_brute_force_marginals():
    """The marginals themselves (what the second-order pass differentiates) are exact."""
    params = random_params(np.random.default_rng(9), scale=2.0)
    x = layers.encode("ACGUGCAUGCAU")
    np.testing.assert_allclose(layers.pair_probs(params, x), brute_force_pair_probs(params, x), atol=1e-12)


# -------------------------------------------------------------------- vmap with lengths


def _padded_batch(seqs, width=None):
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    if width is not None:
        tokens = jnp.pad(tokens, ((0, 0), (0, width - tokens.shape[1])), constant_values=layers.PAD_TOKEN)
    return tokens, lengths


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_vmap_with_per_example_lengths_equals_the_batched_call(grammar):
    make, _ = GRAMMARS[grammar]
    params = make()
    seqs = ["GGGGAAACCCCAUAUG", "GCGCUUCGGCG", "ACGU", ""]
    tokens, lengths = _padded_batch(seqs, width=24)
    for fn in (layers.log_partition, layers.max_score):
        batched = fn(params, tokens, lengths)
        mapped = jax.vmap(fn, (None, 0, 0))(params, tokens, lengths)
        np.testing.assert_allclose(mapped, batched, rtol=1e-12, atol=1e-12)
    probs = layers.pair_probs(params, tokens, lengths)
    np.testing.assert_allclose(jax.vmap(layers.pair_probs, (None, 0, 0))(params, tokens, lengths), probs, atol=1e-12)
    best = layers.best_structure(params, tokens, lengths)
    np.testing.assert_array_equal(jax.vmap(layers.best_structure, (None, 0, 0))(params, tokens, lengths), best)
    score = layers.structure_score(params, tokens, best, lengths)
    np.testing.assert_allclose(jax.vmap(layers.structure_score, (None, 0, 0, 0))(params, tokens, best, lengths), score,
                               rtol=1e-12)
    mea = jax.vmap(lambda p, n: layers.mea_structure(p, n, gamma=2.0))(probs, lengths)
    np.testing.assert_array_equal(mea, layers.mea_structure(probs, lengths, gamma=2.0))
    # a per-example loss over padded data: value_and_grad under vmap
    per_example = jax.vmap(jax.value_and_grad(lambda p, x, n: layers.log_partition(p, x, n)), (None, 0, 0))
    values, grads = per_example(params, tokens, lengths)
    np.testing.assert_allclose(values, layers.log_partition(params, tokens, lengths), rtol=1e-12, atol=1e-12)
    total = jax.grad(lambda p: jnp.sum(layers.log_partition(p, tokens, lengths)))(params)
    for g_sum, g in zip(jax.tree.leaves(total), jax.tree.leaves(grads)):
        np.testing.assert_allclose(jnp.sum(g, axis=0), g_sum, rtol=1e-9, atol=1e-9)


def test_vmap_with_lengths_and_phi():
    params = random_params(np.random.default_rng(2))
    tokens, lengths = _padded_batch(["GGGGAAACCCCAUAUG", "GCGCUUCGGCG"], width=20)
    phi = jnp.asarray(np.random.default_rng(3).normal(size=(2, 20, 20)))
    mapped = jax.vmap(lambda x, n, f: layers.log_partition(params, x, n, phi=f))(tokens, lengths, phi)
    np.testing.assert_allclose(mapped, layers.log_partition(params, tokens, lengths, phi=phi), rtol=1e-12)


def test_scalar_lengths_for_one_sequence_mark_its_padding():
    params = random_params(np.random.default_rng(4))
    x = layers.encode("GGGGAAACCCC")
    padded = jnp.pad(x, (0, 5), constant_values=layers.PAD_TOKEN)
    np.testing.assert_allclose(layers.log_partition(params, padded, 11), layers.log_partition(params, x), rtol=1e-12)
    with pytest.raises(ValueError, match="outside 0..n"):
        layers.log_partition(params, x, 12)
    with pytest.raises(ValueError, match="scalar"):
        layers.log_partition(params, x, jnp.array([11]))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_linear_row_sums_equal_the_log_space_row_sums(dtype):
    """The Turner outside pass sums its interior-loop rows in linear space (``_sum_linear_rows``);
    the inside pass takes each row's log first. Same value, first and second derivatives, also
    for scales ~100 nats apart, empty rows and cells with no loop at all (-inf, no NaN)."""
    from foldax.layers import turner

    rng = np.random.default_rng(0)
    blocks = []
    for rows in (27, 2, 1):
        values = rng.uniform(0.0, 3.0, (2, rows, 6))
        values[:, 0, :2] = 0.0  # empty rows
        scales = rng.normal(0.0, 2.0, (2, rows, 6))  # every block matters ...
        scales[:, :, 3:] = rng.normal(0.0, 40.0, (2, rows, 3))  # ... and cells whose rows lie ~100 nats apart
        blocks.append((values, scales))
    blocks[-1][1][0, 0, 4] = 120.0  # the one-row block dominates a cell
    for values, _ in blocks:
        values[1, :, 5] = 0.0  # a cell without any loop
    blocks = [(jnp.asarray(v, dtype), jnp.asarray(s, dtype)) for v, s in blocks]

    def log_space(blocks):
        terms = jnp.concatenate([jnp.log(v) + s for v, s in blocks], axis=1)
        return jax.nn.logsumexp(terms, axis=1)

    linear, reference = turner._sum_linear_rows(blocks), log_space(blocks)
    rtol = 1e-6 if dtype == jnp.float32 else 1e-13
    assert bool(jnp.isneginf(linear[1, 5])) and bool(jnp.isneginf(reference[1, 5]))
    np.testing.assert_allclose(linear, reference, rtol=rtol)

    # d/d log_scale (the outer mismatches' path), and its derivative again along a direction.
    def total(fn, scales):
        out = fn([(v, s) for (v, _), s in zip(blocks, scales)])
        return jnp.sum(jnp.where(jnp.isfinite(out), out, 0.0))

    scales = [s for _, s in blocks]
    direction = [jnp.asarray(rng.normal(size=s.shape), dtype) for s in scales]

    def hvp(fn):
        return jax.jvp(jax.grad(lambda s: total(fn, s)), (scales,), (direction,))[1]

    for order, (got_all, want_all) in enumerate([
            (jax.grad(lambda s: total(turner._sum_linear_rows, s))(scales), jax.grad(lambda s: total(log_space, s))(scales)),
            (hvp(turner._sum_linear_rows), hvp(log_space))]):
        for got, want in zip(got_all, want_all):
            # The log-space reference is NaN at the cell without a loop; the linear sum gives 0 there.
            assert bool(jnp.all(jnp.isfinite(got)))
            assert bool(jnp.all(jnp.isnan(want[1, :, 5]))) and not bool(jnp.any(got[1, :, 5]))
            want = want.at[1, :, 5].set(0.0)
            np.testing.assert_allclose(got, want, rtol=rtol * 10 ** (order + 1), atol=rtol * 10**order)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_linear_row_sums_second_derivatives_where_every_row_is_far_below_its_scale(dtype):
    """A cell whose rows all hold tiny linear values (~e^-60 of their scales: the window's column
    maximum lies at a width none of the block's rows can use) has a tiny linear total. Its
    second derivatives must not square that total (1e-52 underflows in float32: NaN in the
    gradient of pair_probs on a 451-nt GC-rich ArchiveII sequence)."""
    from foldax.layers import turner

    rng = np.random.default_rng(1)
    logs, scales = [], []
    for rows in (27, 2, 1):
        logs.append(rng.normal(0.0, 1.0, (1, rows, 4)))
        scales.append(rng.normal(0.0, 2.0, (1, rows, 4)))
    for block in logs:
        block[:, :, 1] -= 60.0  # every row of cell 1 ~ 1e-26
        block[:, :, 2] -= 100.0 if dtype == jnp.float64 else 60.0  # cell 2: further still where float64 allows
    logs = [jnp.asarray(u, dtype) for u in logs]
    scales = [jnp.asarray(v, dtype) for v in scales]

    def linear(args):  # the values enter as exp(log-values), as the window's entries do in the engine
        logs, scales = args
        return jnp.sum(turner._sum_linear_rows([(jnp.exp(u), v) for u, v in zip(logs, scales)]))

    def log_space(args):
        logs, scales = args
        return jnp.sum(jax.nn.logsumexp(jnp.concatenate([u + v for u, v in zip(logs, scales)], axis=1), axis=1))

    args = (logs, scales)
    direction = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), dtype), args)
    rtol = 1e-5 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(linear(args), log_space(args), rtol=rtol)
    for fn in (jax.grad, lambda f: lambda a: jax.jvp(jax.grad(f), (a,), (direction,))[1]):
        got, want = fn(linear)(args), fn(log_space)(args)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert bool(jnp.all(jnp.isfinite(g)))
            np.testing.assert_allclose(g, w, rtol=rtol * 100, atol=rtol)


@pytest.mark.slow
def test_pair_probs_gradient_across_a_long_gc_helix_is_finite_in_float32():
    """A 24-bp GC helix: the interior-loop rows of the cells around it lie ~60 nats below their
    windows' column maxima. float32 second derivatives of the outside pass's linear row sums
    squared that tiny total (NaN in every table's gradient before the fix); they must match
    float64."""
    seq = "GCAUCAGC" + "GGGCGCCGGGCGCCCGGCGGCGCG" + "GAAA" + "CGCGCCGCCGGGCGCCCGGCGCCC" + "AGUCAUGC"
    tokens = layers.encode(seq)
    weights = np.random.default_rng(0).random((len(seq), len(seq)))
    grads = {}
    for dtype in (jnp.float32, jnp.float64):
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype), layers.turner2004())
        grads[dtype] = jax.grad(lambda p: jnp.sum(jnp.asarray(weights, dtype)
                                                  * layers.pair_probs(p, tokens, num_chunks=2)))(params)
    flat32, flat64 = (ravel_pytree({k: v for k, v in grads[d].items() if k != "special_hairpins"})[0]
                      for d in (jnp.float32, jnp.float64))
    assert bool(jnp.all(jnp.isfinite(flat32))) and bool(jnp.all(jnp.isfinite(flat64)))
    np.testing.assert_allclose(np.asarray(flat32, np.float64), np.asarray(flat64),
                               atol=5e-3 * float(jnp.max(jnp.abs(flat64))), rtol=0)
