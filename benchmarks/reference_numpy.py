"""Plain-loop float64 reference for the inside algorithm, used to verify the baselines.

This is the grammar written out cell by cell with no tricks. It is jitted with
numba when numba is importable (n=300 takes ~0.1 s instead of minutes); otherwise
the same code runs as plain Python.

Charts are (n+1) x (n+1) so that empty spans (i = j+1) can be read without
special cases: Z = Zn = 0 there, and P = -inf everywhere it is not computed.
"""
import math

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is optional
    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


@njit(cache=True)
def _add(a, b, use_max):
    """logaddexp (use_max=False) or max (use_max=True), -inf safe."""
    if use_max:
        return max(a, b)
    m = max(a, b)
    if m == -np.inf:
        return -np.inf
    return m + math.log(math.exp(a - m) + math.exp(b - m))


@njit(cache=True)
def _inside(stack, pair, unpaired, loop, phi, x, h, use_max):
    n = x.shape[0]
    neg = -np.inf
    P = np.full((n + 1, n + 1), neg)
    Zn = np.zeros((n + 1, n + 1))
    Z = np.zeros((n + 1, n + 1))
    for d in range(n):
        for i in range(n - d):
            j = i + d
            if d > h:
                inner = _add(stack[x[i], x[j], x[j - 1], x[i + 1]] + P[i + 1, j - 1],
                             loop + Zn[i + 1, j - 1], use_max)
                P[i, j] = pair[x[i], x[j]] + phi[i, j] + inner
            zn = unpaired[x[i]] + Z[i + 1, j]
            for k in range(i + h + 1, j):
                zn = _add(zn, P[i, k] + Z[k + 1, j], use_max)
            Zn[i, j] = zn
            Z[i, j] = _add(zn, P[i, j], use_max)
    return Z[0, n - 1] if n > 0 else 0.0


def reference_log_partition(params, tokens, min_hairpin=3, phi=None, semiring="log"):
    """log Z (or the max-semiring score) of one sequence, float64, plain loops."""
    x = np.asarray(tokens, dtype=np.int64)
    n = x.shape[0]
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    phi = np.zeros((n, n)) if phi is None else np.asarray(phi, dtype=np.float64)
    if n == 0:
        return 0.0
    return float(_inside(p["stack"], p["pair"], p["unpaired"], float(p["loop"]),
                         phi, x, int(min_hairpin), semiring == "max"))
