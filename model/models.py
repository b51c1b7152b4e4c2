"""Scoring models built on :class:`layers.nnx_layer.InsideLayer`.

Every model exposes the same small interface, used by the loss, decoding and
training code (:mod:`model.loss`, :mod:`model.decoding`, :mod:`train.train`):

* ``model.inside`` -- its :class:`~layers.nnx_layer.InsideLayer` (the four
  score tensors; ``min_hairpin`` and ``num_chunks`` are static);
* ``model.scores(tokens, lengths) -> (params, phi)`` -- the score tensors as a
  dict and the extra pair potentials ``phi [B, L, L]`` (``None`` for the
  stacking model);
* ``model(tokens, lengths) -> log Z [B]``.

Models:

* :class:`StackingModel` -- just the score tensors (the classic trained
  nearest-neighbour-like model, 656 parameters).
* :class:`NeuralPhiModel` -- the score tensors plus a small neural network that
  reads the sequence and writes ``phi``: an embedding, a few residual 1D
  convolutions (masked to the sequence length, so padding never changes a
  result) and a bilinear pair head ``phi[i, j] = <A h_i, B h_j> / sqrt(d)``.
  ``B`` starts at zero, so ``phi = 0`` at initialisation and the model starts
  as the stacking model; both parts are trained jointly.
* :class:`LinenNeuralPhiModel` -- the same network as a Linen module, with the
  DP through :func:`layers.nnx_layer.LinenInsideLayer`.

:func:`create_model` builds one from an ``ml_collections`` config (``config.model``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from layers.alphabet import NUM_TOKENS
from layers.chart import DEFAULT_NUM_CHUNKS
from layers.nnx_layer import InsideLayer, LinenInsideLayer

__all__ = ["StackingModel", "NeuralPhiModel", "PairEncoder", "LinenNeuralPhiModel", "create_model", "MODEL_NAMES"]

MODEL_NAMES = ("stacking", "neural")


def _length_mask(tokens, lengths):
    idx = jnp.arange(tokens.shape[-1])
    if lengths is None:
        return jnp.ones(tokens.shape, bool)
    return idx[None, :] < jnp.asarray(lengths)[:, None]


class StackingModel(nnx.Module):
    """The score tensors alone (``phi = None``).

    Args: those of :class:`~layers.nnx_layer.InsideLayer` (``rngs``,
    ``params``, ``init_scale``, ``min_hairpin``, ``num_chunks``).
    """

    def __init__(self, *, rngs: nnx.Rngs | None = None, params: Mapping | str | None = None,
                 init_scale: float = 0.1, min_hairpin: int = 3, num_chunks: int | None = DEFAULT_NUM_CHUNKS):
        self.inside = InsideLayer(rngs=rngs, params=params, init_scale=init_scale, min_hairpin=min_hairpin,
                                  num_chunks=num_chunks)

    def scores(self, tokens, lengths=None):
        return self.inside.params_dict(), None

    def __call__(self, tokens, lengths=None):
        return self.inside(tokens, lengths)


class PairEncoder(nnx.Module):
    """Sequence -> pair potentials ``phi [B, L, L]`` (see the module docstring)."""

    def __init__(self, *, features: int = 32, kernel_size: int = 9, num_layers: int = 2, pair_features: int = 16,
                 rngs: nnx.Rngs):
        self.embed = nnx.Embed(NUM_TOKENS, features, rngs=rngs)
        self.convs = nnx.List(
            [nnx.Conv(features, features, kernel_size=(kernel_size,), padding="SAME", rngs=rngs)
             for _ in range(num_layers)]
        )
        self.norm = nnx.LayerNorm(features, rngs=rngs)
        self.left = nnx.Linear(features, pair_features, rngs=rngs)
        self.right = nnx.Linear(features, pair_features, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.pair_features = pair_features

    def __call__(self, tokens, lengths=None):
        mask = _length_mask(tokens, lengths)[..., None]
        h = self.embed(jnp.clip(tokens, 0, NUM_TOKENS - 1)) * mask
        for conv in self.convs:
            h = (h + jax.nn.gelu(conv(h))) * mask
        h = self.norm(h) * mask
        return jnp.einsum("bif,bjf->bij", self.left(h), self.right(h)) / math.sqrt(self.pair_features)


class NeuralPhiModel(nnx.Module):
    """Score tensors + a :class:`PairEncoder` writing ``phi``, trained jointly.

    Args:
      rngs: initialisation (the encoder and, without ``params``, the tensors).
      params, init_scale, min_hairpin, num_chunks: of the inside layer.
      features, kernel_size, num_layers, pair_features: of the encoder.
    """

    def __init__(self, *, rngs: nnx.Rngs, params: Mapping | str | None = None, init_scale: float = 0.1,
                 min_hairpin: int = 3, num_chunks: int | None = DEFAULT_NUM_CHUNKS, features: int = 32,
                 kernel_size: int = 9, num_layers: int = 2, pair_features: int = 16):
        self.inside = InsideLayer(rngs=rngs, params=params, init_scale=init_scale, min_hairpin=min_hairpin,
                                  num_chunks=num_chunks)
        self.encoder = PairEncoder(features=features, kernel_size=kernel_size, num_layers=num_layers,
                                   pair_features=pair_features, rngs=rngs)

    def scores(self, tokens, lengths=None):
        tokens = jnp.asarray(tokens)
        if tokens.ndim == 1:
            return self.inside.params_dict(), self.encoder(tokens[None], lengths)[0]
        return self.inside.params_dict(), self.encoder(tokens, lengths)

    def __call__(self, tokens, lengths=None):
        _, phi = self.scores(tokens, lengths)
        return self.inside(tokens, lengths, phi=phi)


class LinenNeuralPhiModel(nn.Module):
    """:class:`NeuralPhiModel` in Linen; the DP runs in :func:`~layers.nnx_layer.LinenInsideLayer`.

    ``__call__(tokens, lengths, pair_table=None)`` returns a dict with ``log_z
    [B]``, ``phi [B, L, L]`` and, given ``pair_table``, ``score [B]`` (the
    structures' scores, so that ``log_z - score`` is the CLL loss per sequence).
    """

    features: int = 32
    kernel_size: int = 9
    num_layers: int = 2
    pair_features: int = 16
    min_hairpin: int = 3
    num_chunks: int | None = DEFAULT_NUM_CHUNKS
    init_scale: float = 0.1

    @nn.compact
    def __call__(self, tokens, lengths, pair_table=None):
        mask = _length_mask(tokens, lengths)[..., None]
        h = nn.Embed(NUM_TOKENS, self.features)(jnp.clip(tokens, 0, NUM_TOKENS - 1)) * mask
        for _ in range(self.num_layers):
            h = (h + jax.nn.gelu(nn.Conv(self.features, (self.kernel_size,), padding="SAME")(h))) * mask
        h = nn.LayerNorm()(h) * mask
        left = nn.Dense(self.pair_features, name="left")(h)
        right = nn.Dense(self.pair_features, kernel_init=nn.initializers.zeros, name="right")(h)
        phi = jnp.einsum("bif,bjf->bij", left, right) / math.sqrt(self.pair_features)
        inside = LinenInsideLayer(min_hairpin=self.min_hairpin, num_chunks=self.num_chunks,
                                  init_scale=self.init_scale, name="inside")
        out = {"log_z": inside(tokens, lengths, phi=phi), "phi": phi}
        if pair_table is not None:
            out["score"] = inside.structure_score(tokens, pair_table, lengths, phi=phi)
        return out


def create_model(config, rngs: nnx.Rngs):
    """The model of ``config`` (``config.model`` of an ``ml_collections`` config, or a mapping).

    Fields: ``name`` (``"stacking"`` | ``"neural"``), ``init`` (``"random"`` |
    ``"default"`` = :func:`layers.default_params` | a path to an ``.npz``),
    ``init_scale``, ``min_hairpin``, ``num_chunks`` (0: automatic); for ``neural`` also
    ``features``, ``kernel_size``, ``num_layers``, ``pair_features``.
    """
    get = config.get if hasattr(config, "get") else (lambda k, d=None: getattr(config, k, d))
    name = get("name", "stacking")
    init = get("init", "random")
    if init == "random":
        params = None
    elif init == "default":
        params = "default"
    else:
        import numpy as np

        with np.load(init) as f:
            params = {k: f[k] for k in ("stack", "pair", "unpaired", "loop")}
    num_chunks = get("num_chunks", DEFAULT_NUM_CHUNKS)
    num_chunks = int(num_chunks) if num_chunks else None  # 0 / None: automatic (by length)
    common = dict(rngs=rngs, params=params, init_scale=float(get("init_scale", 0.1)),
                  min_hairpin=int(get("min_hairpin", 3)), num_chunks=num_chunks)
    if name == "stacking":
        return StackingModel(**common)
    if name == "neural":
        return NeuralPhiModel(**common, features=int(get("features", 32)), kernel_size=int(get("kernel_size", 9)),
                              num_layers=int(get("num_layers", 2)), pair_features=int(get("pair_features", 16)))
    raise ValueError(f"unknown model name {name!r}; one of {MODEL_NAMES}")
