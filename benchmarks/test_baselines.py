"""Checks that the two baselines compute the right numbers.

The numba reference is first checked against a brute-force sum over all nested
structures (tiny n), which does not share its recursion; then the naive JAX scan
and the C++ library are checked against the reference at n = 50..300.
Run: python -m pytest benchmarks/test_baselines.py   (or python -m benchmarks.test_baselines)
"""
import math
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cpp_baseline import cpp_log_partition, cpp_log_partition_batch  # noqa: E402
from benchmarks.reference_numpy import reference_log_partition  # noqa: E402


def random_params(rng):
    return {"stack": rng.normal(size=(5, 5, 5, 5)), "pair": rng.normal(size=(5, 5)),
            "unpaired": rng.normal(size=5), "loop": rng.normal()}


def brute_force(params, x, h, phi, semiring="log"):
    """Sum (or max) over every nested pairing with j - i > h of exp(score), where a
    pair scores pair + phi + (stack if (i+1, j-1) is also a pair else loop) and an
    unpaired base scores unpaired[x_i]."""
    n = len(x)

    @lru_cache(None)
    def structures(i, j):  # all sets of nested pairs inside span i..j, as tuples
        if i > j:
            return [()]
        out = [s for s in structures(i + 1, j)]  # i unpaired
        for k in range(i + h + 1, j + 1):  # i pairs with k
            for inner in structures(i + 1, k - 1):
                for rest in structures(k + 1, j):
                    out.append(((i, k),) + inner + rest)
        return out

    scores = []
    for s in structures(0, n - 1):
        pairs = set(s)
        paired = {b for p in s for b in p}
        sc = sum(params["unpaired"][x[b]] for b in range(n) if b not in paired)
        for i, j in s:
            sc += params["pair"][x[i], x[j]] + phi[i][j]
            if (i + 1, j - 1) in pairs:
                sc += params["stack"][x[i], x[j], x[j - 1], x[i + 1]]
            else:
                sc += params["loop"]
        scores.append(sc)
    if semiring == "max":
        return max(scores)
    m = max(scores)
    return m + math.log(sum(math.exp(v - m) for v in scores))


def test_reference_matches_brute_force():
    rng = np.random.default_rng(1)
    for n in range(0, 11):
        for h in (0, 1, 3):
            p, x = random_params(rng), rng.integers(0, 5, n)
            phi = rng.normal(size=(n, n))
            for sr in ("log", "max"):
                r = reference_log_partition(p, x, h, phi, sr)
                b = brute_force(p, x, h, phi, sr) if n else 0.0
                assert abs(r - b) < 1e-9 * max(1, abs(b)), (n, h, sr, r, b)


def test_cpp_matches_reference():
    rng = np.random.default_rng(2)
    for n in (0, 1, 4, 5, 50, 100, 200, 300):
        for h in (0, 3):
            p, x = random_params(rng), rng.integers(0, 5, n).astype(np.int32)
            phi = rng.normal(size=(n, n)) if n % 2 == 0 else None
            r = reference_log_partition(p, x, h, phi)
            scale = max(1.0, abs(r))
            assert abs(cpp_log_partition(p, x, h, phi, np.float64) - r) < 1e-12 * scale
            assert abs(cpp_log_partition(p, x, h, phi, np.float32) - r) < 2e-5 * scale


def test_cpp_batch_matches_single():
    rng = np.random.default_rng(3)
    B, L = 7, 120
    p, x = random_params(rng), rng.integers(0, 5, (B, L)).astype(np.int32)
    lengths = rng.integers(0, L + 1, B).astype(np.int32)
    phi = rng.normal(size=(B, L, L))
    for dtype in (np.float32, np.float64):
        out = cpp_log_partition_batch(p, x, lengths, 3, phi, dtype, threads=2)
        want = [cpp_log_partition(p, x[b, :lengths[b]], 3, phi[b, :lengths[b], :lengths[b]], dtype)
                for b in range(B)]
        np.testing.assert_array_equal(out, np.asarray(want, dtype))


def test_naive_scan_matches_reference():
    import jax.numpy as jnp
    from benchmarks.naive_scan import naive_log_partition, naive_log_partition_batch

    rng = np.random.default_rng(4)
    for n, h, sr in ((0, 3, "log"), (1, 0, "log"), (5, 3, "max"), (50, 0, "log"),
                     (100, 3, "max"), (200, 3, "log"), (300, 3, "log")):
        p, x = random_params(rng), rng.integers(0, 5, n).astype(np.int32)
        phi = rng.normal(size=(n, n)) if n % 2 == 0 else None
        r = reference_log_partition(p, x, h, phi, sr)
        jp = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
        jphi = None if phi is None else jnp.asarray(phi, jnp.float32)
        got = float(naive_log_partition(jp, jnp.asarray(x), h, jphi, sr))
        assert abs(got - r) < 2e-5 * max(1.0, abs(r)), (n, h, sr, got, r)
    B, n = 4, 64
    p, x = random_params(rng), rng.integers(0, 5, (B, n)).astype(np.int32)
    jp = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    got = np.asarray(naive_log_partition_batch(jp, jnp.asarray(x)))
    want = [reference_log_partition(p, x[b]) for b in range(B)]
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_naive_scan_gradient_is_finite_and_exact():
    """jax.grad of the naive scan equals the engine's exact gradient (expected counts), no NaN."""
    import jax
    import jax.numpy as jnp

    from foldax import layers
    from benchmarks.naive_scan import naive_log_partition

    rng = np.random.default_rng(5)
    for n, sr in ((12, "log"), (30, "log"), (30, "max")):
        p = {k: jnp.asarray(v, jnp.float32) for k, v in random_params(rng).items()}  # no x64 here
        x = jnp.asarray(rng.integers(0, 5, n), jnp.int32)
        exact = layers.log_partition if sr == "log" else layers.max_score
        got = jax.grad(lambda q: naive_log_partition(q, x, semiring=sr))(p)
        want = jax.grad(lambda q: exact(q, x))(p)
        for k in p:
            assert np.all(np.isfinite(got[k])), (n, sr, k)
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=f"{n} {sr} {k}")


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)
