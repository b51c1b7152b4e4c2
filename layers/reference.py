"""Plain reference implementations: the oracles every fast path is tested against.

* :func:`reference_log_partition` runs the recursion cell by cell with Python
  loops in float64 (any semiring), straight from the grammar in ``chart.py``.
* :func:`enumerate_structures` lists every nested structure of a short sequence
  and :func:`brute_force_log_partition` sums their scores: it shares nothing
  with the recursion, so it checks the grammar itself.

Both are slow on purpose (O(n^3) Python, resp. exponential) and only meant for
tests and for readers who want the recursion without the engine's layout.
"""

from __future__ import annotations

import math

import numpy as np

NEG_INF = -math.inf


def random_params(rng, scale=1.0, dtype=np.float64):
    """Gaussian score tensors ``N(0, scale^2)`` from a numpy ``Generator`` (for tests)."""
    import jax.numpy as jnp

    shapes = {"stack": (5, 5, 5, 5), "pair": (5, 5), "unpaired": (5,), "loop": ()}
    return {k: jnp.asarray(scale * rng.normal(size=s), dtype) for k, s in shapes.items()}


def _as_numpy_params(params):
    return {k: np.asarray(params[k], dtype=np.float64) for k in ("stack", "pair", "unpaired", "loop")}


def _lse(values):
    values = [v for v in values if v != NEG_INF]
    if not values:
        return NEG_INF
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def reference_charts(params, tokens, *, phi=None, min_hairpin=3, semiring="log"):
    """Returns ``(P, Zn, Z)`` as float64 ``[n + 1, n + 1]`` arrays (cell ``[i, j]``).

    Rows/columns go to ``n`` so that ``Z[i + 1, j]`` exists for ``i = j``; empty
    spans (``i > j``) hold 0 in ``Z``/``Zn`` and -inf in ``P``.
    """
    p = _as_numpy_params(params)
    x = [int(t) for t in np.asarray(tokens)]
    n = len(x)
    phi = np.zeros((n, n)) if phi is None else np.asarray(phi, dtype=np.float64)
    plus = _lse if semiring == "log" else (lambda vs: max(vs, default=NEG_INF))
    P = np.full((n + 1, n + 1), NEG_INF)
    Zn = np.zeros((n + 1, n + 1))
    Z = np.zeros((n + 1, n + 1))
    for d in range(n):
        for i in range(n - d):
            j = i + d
            if d > min_hairpin:
                inner_p = P[i + 1, j - 1] if i + 1 <= j - 1 else NEG_INF
                inner_zn = Zn[i + 1, j - 1] if i + 1 <= j - 1 else 0.0
                stack = p["stack"][x[i], x[j], x[j - 1], x[i + 1]]
                P[i, j] = p["pair"][x[i], x[j]] + phi[i, j] + plus(
                    [stack + inner_p, p["loop"] + inner_zn]
                )
            split = [P[i, k] + Z[k + 1, j] for k in range(i + min_hairpin + 1, j)]
            Zn[i, j] = plus([p["unpaired"][x[i]] + Z[i + 1, j]] + split)
            Z[i, j] = plus([Zn[i, j], P[i, j]])
    return P, Zn, Z


def reference_log_partition(params, tokens, *, phi=None, min_hairpin=3, semiring="log"):
    """log Z (``semiring="log"``) or the best score (``"max"``) by plain loops, float64."""
    n = len(np.asarray(tokens))
    if n == 0:
        return 0.0
    _, _, Z = reference_charts(params, tokens, phi=phi, min_hairpin=min_hairpin, semiring=semiring)
    return float(Z[0, n - 1])


def enumerate_structures(n: int, min_hairpin: int = 3):
    """Yields every nested structure on ``n`` bases as a tuple of pairs ``(i, j)``.

    Pairs satisfy ``j - i > min_hairpin``; each base pairs at most once; no two
    pairs cross. Exponential: meant for ``n <= 12`` or so.
    """

    def structures(lo, hi):  # all structures inside [lo, hi]
        if hi - lo < 1:
            yield ()
            return
        # base `lo` unpaired
        yield from structures(lo + 1, hi)
        # base `lo` paired with k
        for k in range(lo + min_hairpin + 1, hi + 1):
            for inside in structures(lo + 1, k - 1):
                for outside in structures(k + 1, hi):
                    yield ((lo, k),) + inside + outside

    yield from structures(0, n - 1)


def structure_score_reference(params, tokens, pairs, *, phi=None):
    """score(s) = sum over pairs of [pair + phi + (stack if (i+1, j-1) in s else loop)]
    + sum over unpaired bases of unpaired."""
    p = _as_numpy_params(params)
    x = [int(t) for t in np.asarray(tokens)]
    n = len(x)
    pair_set = set(pairs)
    paired = {b for pr in pairs for b in pr}
    score = 0.0
    for i, j in pairs:
        score += p["pair"][x[i], x[j]] + (0.0 if phi is None else float(phi[i][j]))
        if (i + 1, j - 1) in pair_set:
            score += p["stack"][x[i], x[j], x[j - 1], x[i + 1]]
        else:
            score += p["loop"]
    score += sum(p["unpaired"][x[i]] for i in range(n) if i not in paired)
    return float(score)


def brute_force_log_partition(params, tokens, *, phi=None, min_hairpin=3, semiring="log"):
    """log sum_s exp(score(s)) (or max_s score(s)) over all structures, float64."""
    n = len(np.asarray(tokens))
    scores = [
        structure_score_reference(params, tokens, s, phi=phi)
        for s in enumerate_structures(n, min_hairpin)
    ]
    return _lse(scores) if semiring == "log" else max(scores)


def brute_force_pair_probs(params, tokens, *, phi=None, min_hairpin=3):
    """Exact base-pair marginals [n, n] (symmetric) by enumeration, float64."""
    n = len(np.asarray(tokens))
    structs = list(enumerate_structures(n, min_hairpin))
    scores = np.array([structure_score_reference(params, tokens, s, phi=phi) for s in structs])
    weights = np.exp(scores - scores.max())
    weights /= weights.sum()
    probs = np.zeros((n, n))
    for w, s in zip(weights, structs):
        for i, j in s:
            probs[i, j] += w
            probs[j, i] += w
    return probs


def count_structures(n: int, min_hairpin: int = 3) -> int:
    """Number of nested structures (for sanity checks of the enumerator)."""
    return sum(1 for _ in enumerate_structures(n, min_hairpin))


__all__ = [
    "random_params",
    "reference_charts",
    "reference_log_partition",
    "enumerate_structures",
    "structure_score_reference",
    "brute_force_log_partition",
    "brute_force_pair_probs",
    "count_structures",
]
