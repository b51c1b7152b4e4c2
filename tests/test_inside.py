"""Exactness of the chart engine (log_partition / max_score) against the oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax import layers
from foldax.layers.chart import diagonal_chunks
from foldax.layers.reference import brute_force_log_partition, random_params, reference_log_partition

SEMIRINGS = {"log": layers.log_partition, "max": layers.max_score}


def rel_err(a, b):
    return abs(float(a) - float(b)) / max(1.0, abs(float(b)))


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("min_hairpin", [0, 1, 3, 5])
@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_matches_brute_force(semiring, min_hairpin, scale):
    rng = np.random.default_rng(hash((semiring, min_hairpin, scale)) % 2**32)
    params = random_params(rng, scale)
    lengths = np.array([0, 1, 2, min_hairpin, min_hairpin + 1, min_hairpin + 2, 8, 11, 12])
    tokens = rng.integers(0, 5, (len(lengths), 12))  # includes N (4); one padded batch, one compile
    with_phi = min_hairpin % 2 == 0  # half the cases with phi, half through the phi=None path
    phi = rng.normal(size=(len(lengths), 12, 12)) * scale if with_phi else None
    exact = [
        brute_force_log_partition(params, tokens[b, :n], phi=None if phi is None else phi[b, :n, :n],
                                  min_hairpin=min_hairpin, semiring=semiring)
        for b, n in enumerate(lengths)
    ]
    f = SEMIRINGS[semiring]
    got64 = f(params, tokens, lengths, phi=phi, min_hairpin=min_hairpin)
    assert got64.dtype == jnp.float64
    for b in range(len(lengths)):
        assert rel_err(got64[b], exact[b]) <= 1e-10, (lengths[b], got64[b], exact[b])
    params32 = {k: v.astype(jnp.float32) for k, v in params.items()}
    phi32 = None if phi is None else phi.astype(np.float32)
    got32 = f(params32, tokens, lengths, phi=phi32, min_hairpin=min_hairpin)
    assert got32.dtype == jnp.float32
    for b in range(len(lengths)):
        # float32 carries ~1e-7 relative error per operation; scores of size ~scale*n add up.
        assert rel_err(got32[b], exact[b]) <= 1e-5 * scale, (lengths[b], got32[b], exact[b])
    # The single-sequence path ([n] tokens -> scalar) agrees with the batch.
    n = int(lengths[-2])
    single = f(params, tokens[-2, :n], phi=None if phi is None else phi[-2, :n, :n], min_hairpin=min_hairpin)
    assert rel_err(single, exact[-2]) <= 1e-10


def test_iupac_and_case_encode_like_n():
    rng = np.random.default_rng(3)
    params = random_params(rng)
    seq = "acgtRYKMswbdhvN"
    tokens = layers.encode(seq)
    assert tokens.tolist() == [0, 1, 2, 3] + [4] * 11
    exact = brute_force_log_partition(params, tokens, min_hairpin=3)
    assert rel_err(layers.log_partition(params, tokens), exact) <= 1e-10


@pytest.mark.parametrize("n, min_hairpin", [(60, 3), (150, 3), (97, 0)])
def test_matches_reference_loops(n, min_hairpin):
    rng = np.random.default_rng(n)
    params = random_params(rng)
    tokens = rng.integers(0, 5, n)
    phi = rng.normal(size=(n, n))
    for semiring, f in SEMIRINGS.items():
        exact = reference_log_partition(params, tokens, phi=phi, min_hairpin=min_hairpin, semiring=semiring)
        got = f(params, tokens, phi=jnp.asarray(phi), min_hairpin=min_hairpin)
        assert rel_err(got, exact) <= 1e-10


@pytest.mark.slow
def test_matches_reference_loops_n300():
    rng = np.random.default_rng(300)
    params = random_params(rng)
    tokens = rng.integers(0, 4, 300)
    exact = reference_log_partition(params, tokens)
    assert rel_err(layers.log_partition(params, tokens), exact) <= 1e-10
    params32 = {k: v.astype(jnp.float32) for k, v in params.items()}
    assert rel_err(layers.log_partition(params32, tokens), exact) <= 1e-5


@pytest.mark.parametrize("num_chunks", [1, 2, 7])
def test_chunking_never_changes_the_result(num_chunks):
    rng = np.random.default_rng(7)
    params = random_params(rng)
    tokens = rng.integers(0, 5, 45)
    base = layers.log_partition(params, tokens, num_chunks=12)
    assert rel_err(layers.log_partition(params, tokens, num_chunks=num_chunks), base) <= 1e-12


def test_diagonal_chunks_cover_every_diagonal_once():
    for length in [1, 2, 7, 64, 129, 800]:
        for k in [1, 3, 12, 24]:
            chunks = diagonal_chunks(length, k)
            assert len(chunks) <= k
            assert chunks[0][0] == 0 and chunks[-1][1] == length
            assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
            assert all(d0 < d1 for d0, d1 in chunks)


def test_automatic_chunk_count_is_capped_per_grammar():
    """The Turner grammar's loop bodies are the expensive ones to compile: it caps the automatic
    count at 8 chunks (BENCHMARKS.md, compile time), the stacking grammar at 16."""
    from foldax.layers.chart import MAX_AUTO_CHUNKS, Problem
    from foldax.layers.stacking import StackingGrammar
    from foldax.layers.turner import TurnerGrammar

    for grammar, cap in ((StackingGrammar(), MAX_AUTO_CHUNKS), (TurnerGrammar(), 8)):
        assert len(Problem(grammar, 2000).chunks) == cap
        assert len(Problem(grammar, 200).chunks) == 200 // 32  # short charts: one chunk per 32 nt
        assert len(Problem(grammar, 2000, num_chunks=12).chunks) == 12  # an explicit count is kept
        chunks = Problem(grammar, 1000).chunks
        assert chunks[0][0] == 0 and chunks[-1][1] == 1000


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_batch_with_mixed_lengths_equals_each_alone(dtype):
    rng = np.random.default_rng(11)
    params = {k: v.astype(dtype) for k, v in random_params(rng, 2.0).items()}
    seqs = ["", "A", "GGGAAAUCC", "ACGUACGUAGCUAGCUAGGCUAGCUAGCAUCGAUCG", "NNGCAUGC"]
    tokens, lengths = layers.encode_batch(seqs)
    phi = rng.normal(size=tokens.shape + (tokens.shape[1],)).astype(dtype)
    for f in SEMIRINGS.values():
        batched = f(params, tokens, lengths, phi=phi)
        assert batched.shape == (len(seqs),)
        for b, s in enumerate(seqs):
            n = len(s)
            alone = f(params, layers.encode(s), phi=phi[b, :n, :n])
            tol = 1e-12 if dtype == jnp.float64 else 1e-6
            assert rel_err(batched[b], alone) <= tol


def test_padding_content_never_changes_a_result():
    rng = np.random.default_rng(5)
    params = random_params(rng)
    tokens, lengths = layers.encode_batch(["GGGGAAACCCC", "ACGUAGCUAGC"], buckets=(32,))
    noisy = tokens.copy()
    phi = np.zeros((2, 32, 32))
    noisy_phi = phi.copy()
    for b, n in enumerate(lengths):
        noisy[b, n:] = rng.integers(0, 5, 32 - n)
        noisy_phi[b, n:, :] = rng.normal(size=(32 - n, 32)) * 100
        noisy_phi[b, :, n:] = rng.normal(size=(32, 32 - n)) * 100
    for f in SEMIRINGS.values():
        clean = f(params, tokens, lengths, phi=phi)
        dirty = f(params, noisy, lengths, phi=noisy_phi)
        np.testing.assert_array_equal(np.asarray(clean), np.asarray(dirty))
        g_clean = jax.grad(lambda p: f(p, tokens, lengths, phi=phi).sum())(params)
        g_dirty = jax.grad(lambda p: f(p, noisy, lengths, phi=noisy_phi).sum())(params)
        for k in g_clean:
            np.testing.assert_allclose(g_clean[k], g_dirty[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("min_hairpin", [0, 1, 3])
@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_edge_lengths_finite_values_and_gradients(min_hairpin, scale):
    rng = np.random.default_rng(min_hairpin)
    lengths = np.array(sorted({0, 1, min_hairpin, min_hairpin + 1, min_hairpin + 2}))
    tokens = rng.integers(0, 5, (len(lengths), 6))
    for dtype in [jnp.float32, jnp.float64]:
        params = {k: v.astype(dtype) for k, v in random_params(rng, scale).items()}
        for semiring, f in SEMIRINGS.items():
            values = f(params, tokens, lengths, min_hairpin=min_hairpin)
            for b, n in enumerate(lengths):
                exact = brute_force_log_partition(params, tokens[b, :n], min_hairpin=min_hairpin, semiring=semiring)
                assert rel_err(values[b], exact) <= (1e-10 if dtype == jnp.float64 else 1e-5)
            for b, n in enumerate(lengths):  # each row's gradient on its own: no NaN from padding
                grads = jax.grad(lambda p: f(p, tokens, lengths, min_hairpin=min_hairpin)[b])(params)
                assert all(bool(jnp.isfinite(g).all()) for g in grads.values()), (n, semiring)
                if n == 0:
                    assert all(float(jnp.abs(g).max()) == 0 for g in grads.values())
    for n in [0, 1]:  # the unbatched path at the smallest sizes
        value, grads = jax.value_and_grad(lambda p: layers.log_partition(p, tokens[0, :n]))(params)
        assert np.isfinite(float(value)) and all(bool(jnp.isfinite(g).all()) for g in grads.values())
        if n == 0:
            assert float(value) == 0.0


def test_large_magnitude_parameters_long_sequence_float32_finite():
    rng = np.random.default_rng(50)
    params = {k: jnp.clip(v, -50, 50).astype(jnp.float32) for k, v in random_params(rng, 25.0).items()}
    tokens, lengths = layers.encode_batch(["".join(rng.choice(list("ACGU"), n)) for n in (5, 90, 120)])
    value, grads = jax.value_and_grad(lambda p: layers.log_partition(p, tokens, lengths).sum())(params)
    assert bool(jnp.isfinite(value))
    assert all(bool(jnp.isfinite(g).all()) for g in grads.values())
    exact = reference_log_partition({k: np.float64(v) for k, v in params.items()}, tokens[2, : lengths[2]])
    assert rel_err(layers.log_partition(params, tokens, lengths)[2], exact) <= 1e-5


def test_gradient_matches_finite_differences_float64():
    rng = np.random.default_rng(21)
    params = random_params(rng)
    tokens = rng.integers(0, 5, 13)
    phi = jnp.asarray(rng.normal(size=(13, 13)))

    def f(p, phi):
        return layers.log_partition(p, tokens, phi=phi, min_hairpin=1)

    g_params, g_phi = jax.grad(f, argnums=(0, 1))(params, phi)
    eps = 1e-6
    for name in ["loop", "unpaired", "pair"]:
        flat = np.asarray(params[name]).ravel()
        for idx in range(flat.size):
            up, down = flat.copy(), flat.copy()
            up[idx] += eps
            down[idx] -= eps
            shape = np.shape(params[name])
            num = (f({**params, name: jnp.asarray(up.reshape(shape))}, phi)
                   - f({**params, name: jnp.asarray(down.reshape(shape))}, phi)) / (2 * eps)
            assert abs(float(np.asarray(g_params[name]).ravel()[idx]) - float(num)) <= 1e-6
    # d logZ / d phi[i, j] is the probability that (i, j) pairs: in [0, 1], zero below the diagonal.
    assert float(g_phi.min()) >= 0 and float(g_phi.max()) <= 1
    assert float(jnp.abs(jnp.tril(g_phi)).max()) == 0


def test_max_semiring_gradient_is_a_structure_indicator():
    rng = np.random.default_rng(8)
    params = random_params(rng)
    tokens = rng.integers(0, 4, 30)
    g_phi = jax.grad(lambda phi: layers.max_score(params, tokens, phi=phi))(jnp.zeros((30, 30)))
    g = np.asarray(g_phi)
    assert set(np.unique(g)) <= {0.0, 1.0}
    assert (g.sum(0) + g.sum(1)).max() <= 1  # each base pairs at most once


def test_jit_and_vmap_agree_with_batched_call():
    rng = np.random.default_rng(2)
    params = random_params(rng)
    tokens = jnp.asarray(rng.integers(0, 5, (4, 20)), jnp.int32)
    batched = layers.log_partition(params, tokens)
    jitted = jax.jit(layers.log_partition)(params, tokens)
    vmapped = jax.vmap(layers.log_partition, in_axes=(None, 0))(params, tokens)
    np.testing.assert_allclose(jitted, batched, rtol=1e-12)
    np.testing.assert_allclose(vmapped, batched, rtol=1e-12)
    g = jax.grad(lambda p: jax.vmap(layers.log_partition, in_axes=(None, 0))(p, tokens).sum())(params)
    g_ref = jax.grad(lambda p: layers.log_partition(p, tokens).sum())(params)
    for k in g:
        np.testing.assert_allclose(g[k], g_ref[k], rtol=1e-10, atol=1e-12)


def test_vmap_over_parameters_and_nested_vmap_equal_each_call_alone():
    """vmap is folded into the engine's batch axis (custom_vmap); every in_axes mix must agree."""
    rng = np.random.default_rng(12)
    stacked = jax.tree.map(lambda *a: jnp.stack(a), random_params(rng), random_params(rng))
    tokens = jnp.asarray(rng.integers(0, 5, (2, 3, 14)), jnp.int32)
    alone = np.array([[float(layers.log_partition(jax.tree.map(lambda a: a[p], stacked), tokens[p, s]))
                       for s in range(3)] for p in range(2)])
    per_params = jax.vmap(layers.log_partition)(stacked, tokens[:, 0])
    np.testing.assert_allclose(per_params, alone[:, 0], rtol=1e-12)
    nested = jax.vmap(jax.vmap(layers.log_partition, in_axes=(None, 0)))(stacked, tokens)
    np.testing.assert_allclose(nested, alone, rtol=1e-12)
    grads = jax.vmap(jax.grad(layers.log_partition))(stacked, tokens[:, 1])
    for p in range(2):
        want = jax.grad(layers.log_partition)(jax.tree.map(lambda a: a[p], stacked), tokens[p, 1])
        for k in want:
            np.testing.assert_allclose(grads[k][p], want[k], rtol=1e-10, atol=1e-12)


def test_one_pass_sum_overflow_falls_back_to_the_exact_two_pass_sum():
    """The log semiring sums a diagonal in one exp pass shifted by a lower bound; a total
    far above that bound overflows it, and the diagonal must then be recomputed exactly."""
    total, ok = layers.LOG.sum_from_below(jnp.array([[100.0], [0.0]], jnp.float32), jnp.zeros(1, jnp.float32))
    assert not bool(ok[0]) and not np.isfinite(float(total[0]))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 3)), jnp.float32)
    near, ok = layers.LOG.sum_from_below(x, jnp.max(x, axis=0) - 1.0)
    assert bool(ok.all())
    np.testing.assert_allclose(near, layers.LOG.sum(x), rtol=1e-6)

    rng = np.random.default_rng(13)
    n = 12
    params = random_params(rng)
    tokens = rng.integers(0, 4, n)
    phi = np.zeros((n, n))
    phi[1, n - 1] = 150.0  # Zn[0][n-1] exceeds Zn[0][n-2] + unpaired[x_{n-1}] by ~150 > 88
    exact = brute_force_log_partition(params, tokens, phi=phi)
    p32 = {k: v.astype(jnp.float32) for k, v in params.items()}
    got = layers.log_partition(p32, tokens, phi=jnp.asarray(phi, jnp.float32))
    assert rel_err(got, exact) <= 1e-5
    batch = jnp.asarray(np.stack([tokens, tokens]), jnp.int32)
    phis = jnp.asarray(np.stack([phi, np.zeros_like(phi)]), jnp.float32)
    mapped = jax.vmap(lambda t, f: layers.log_partition(p32, t, phi=f))(batch, phis)
    assert rel_err(mapped[0], exact) <= 1e-5
    assert rel_err(mapped[1], brute_force_log_partition(params, tokens)) <= 1e-5
    g = jax.grad(lambda f: layers.log_partition(p32, tokens, phi=f))(jnp.asarray(phi, jnp.float32))
    assert bool(jnp.isfinite(g).all()) and float(g[1, n - 1]) == pytest.approx(1.0, abs=1e-5)

    # Several chunks (the refill merges them): value and gradient as in float64, which never overflows.
    n = 100
    tokens = rng.integers(0, 4, n)
    phi = np.zeros((n, n))
    phi[10, 90] = phi[40, 60] = 120.0
    log_z = lambda p, f: layers.log_partition(p, tokens, phi=f, num_chunks=7)
    want, want_grad = jax.value_and_grad(log_z, argnums=(0, 1))(params, jnp.asarray(phi))
    got, got_grad = jax.value_and_grad(log_z, argnums=(0, 1))(p32, jnp.asarray(phi, jnp.float32))
    assert rel_err(got, want) <= 1e-5
    for g32, g64 in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
        assert bool(jnp.isfinite(g32).all())
        np.testing.assert_allclose(g32, g64, atol=2e-3)


def test_bad_inputs_give_clear_errors():
    params = random_params(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"'X' at position 3"):
        layers.encode("ACGXU")
    with pytest.raises(ValueError, match=r"sequence 1: invalid nucleotide '-' at position 2"):
        layers.encode_batch(["ACGU", "AC-U"])
    with pytest.raises(ValueError, match=r"params\['pair'\] must have shape \(5, 5\)"):
        layers.log_partition({**params, "pair": jnp.zeros((4, 4))}, layers.encode("ACGU"))
    with pytest.raises(KeyError, match="missing"):
        layers.log_partition({"pair": params["pair"]}, layers.encode("ACGU"))
    tokens, _ = layers.encode_batch(["ACGU", "GG"], buckets=None)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 5 is outside 0..L = 0..4"):
        layers.log_partition(params, tokens, np.array([4, 5]))
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1"):
        layers.log_partition(params, tokens, np.array([-1, 2]))
    with pytest.raises(ValueError, match=r"token 7 at index \(2,\)"):
        layers.log_partition(params, np.array([0, 1, 7]))
    with pytest.raises(ValueError, match="min_hairpin"):
        layers.log_partition(params, tokens, min_hairpin=-1)
    with pytest.raises(ValueError, match="phi must have shape"):
        layers.log_partition(params, layers.encode("ACGU"), phi=jnp.zeros((3, 3)))


def test_mixed_lengths_inside_a_bucket_compile_once():
    params = random_params(np.random.default_rng(1))
    f = jax.jit(lambda p, x, n: layers.log_partition(p, x, n))  # a fresh function: its own cache
    for seqs in (["ACGUAGC", "GG"], ["GGGGAAACCCCAAA", "A", "ACGU"], ["UUUUU"] * 3):
        tokens, lengths = layers.encode_batch(seqs, buckets=(16,))
        tokens = np.pad(tokens, ((0, 3 - len(seqs)), (0, 0)), constant_values=4)
        lengths = np.pad(lengths, (0, 3 - len(seqs)))
        f(params, tokens, lengths)
    assert f._cache_size() == 1
