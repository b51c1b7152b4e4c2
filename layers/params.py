"""Score parameters: random initialisation and a small built-in default set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from foldax.layers.alphabet import ALPHABET

# Watson-Crick and wobble pairs are the only ones real RNA forms.
CANONICAL_PAIRS = ("AU", "UA", "GC", "CG", "GU", "UG")


def init_params(key, *, scale=0.1, dtype=jnp.float32):
    """Random scores ``N(0, scale^2)`` for every tensor (a neutral starting point).

    >>> params = init_params(jax.random.key(0))
    >>> sorted(params), params["stack"].shape
    (['loop', 'pair', 'stack', 'unpaired'], (5, 5, 5, 5))
    """
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "stack": scale * jax.random.normal(k1, (5, 5, 5, 5), dtype),
        "pair": scale * jax.random.normal(k2, (5, 5), dtype),
        "unpaired": scale * jax.random.normal(k3, (5,), dtype),
        "loop": scale * jax.random.normal(k4, (), dtype),
    }


def default_params(dtype=jnp.float32):
    """A hand-set, physically flavoured default (used by the demo and ``foldax fold``
    when no trained parameters are given): canonical pairs score well, stacking two
    canonical pairs (stronger for G-C) is rewarded, other pairs are strongly penalised,
    and closing a loop costs a little.
    """
    idx = {c: k for k, c in enumerate(ALPHABET)}
    pair = np.full((5, 5), -6.0)
    for p in CANONICAL_PAIRS:
        pair[idx[p[0]], idx[p[1]]] = -1.0
    stack = np.zeros((5, 5, 5, 5))
    strength = {"GC": 1.5, "CG": 1.5, "AU": 0.9, "UA": 0.9, "GU": 0.5, "UG": 0.5}
    for outer in CANONICAL_PAIRS:
        for inner in CANONICAL_PAIRS:
            # stack[x_i, x_j, x_{j-1}, x_{i+1}]: the inner pair is (x_{i+1}, x_{j-1}).
            stack[idx[outer[0]], idx[outer[1]], idx[inner[1]], idx[inner[0]]] = (
                strength[outer] + strength[inner]
            )
    return {
        "stack": jnp.asarray(stack, dtype),
        "pair": jnp.asarray(pair, dtype),
        "unpaired": jnp.zeros((5,), dtype),
        "loop": jnp.asarray(-3.0, dtype),
    }
