"""Scoring models built on :class:`foldax.layers.nnx_layer.InsideLayer`.

Every model exposes the same small interface, used by the loss, decoding and
training code (:mod:`foldax.model.loss`, :mod:`foldax.model.decoding`, :mod:`foldax.train.train`):

* ``model.inside`` -- its :class:`~foldax.layers.nnx_layer.InsideLayer` (the four
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
  DP through :func:`foldax.layers.nnx_layer.LinenInsideLayer`.
* :class:`TurnerModel` (``"turner"``) -- the Turner 2004 energy tables (every table and the
  special hairpin energies are ``nnx.Param`` s; ``+inf`` entries are not parameters, see
  :class:`~foldax.layers.nnx_layer.InsideLayer`), initialised at Turner 2004 or at a parameter file,
  with an L2 prior toward those initial values (:meth:`TurnerModel.prior_penalty`, added to
  the loss by :func:`foldax.model.loss.cll_loss`).
* :class:`TurnerNeuralModel` (``"turner_neural"``) -- :class:`TurnerModel` plus the
  :class:`PairEncoder` of ``neural`` writing ``phi`` (log-weight units, added to ``-E/kT``);
  ``phi = 0`` at initialisation, so it starts as the Turner model.

The prior. With ``theta`` every finite table entry (kcal/mol) and ``theta_0`` its initial value,
``prior_penalty = prior_strength * SUM (theta - theta_0)^2``, added to the CLL loss, which is a
negative log-likelihood *per nucleotide* (nats/nt). So ``prior_strength`` is in nats per
nucleotide per (kcal/mol)^2: a Gaussian prior ``N(theta_0, sigma^2)`` on each entry and a
training set of ``N`` nucleotides give ``prior_strength = 1 / (2 sigma^2 N)`` (the MAP
objective divided by ``N``). E.g. ``sigma = 0.3`` kcal/mol over 200,000 nt is ``2.8e-5``.

:func:`create_model` builds one from an ``ml_collections`` config (``config.model``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from foldax.layers.alphabet import NUM_TOKENS
from foldax.layers.chart import DEFAULT_NUM_CHUNKS
from foldax.layers.energy_params import KT
from foldax.layers.nnx_layer import InsideLayer, LinenInsideLayer

__all__ = ["StackingModel", "NeuralPhiModel", "PairEncoder", "LinenNeuralPhiModel", "TurnerModel",
           "TurnerNeuralModel", "create_model", "grammar_of", "MODEL_NAMES", "TURNER_MODELS"]

MODEL_NAMES = ("stacking", "neural", "turner", "turner_neural")
#: The models on the Turner grammar (energy tables).
TURNER_MODELS = ("turner", "turner_neural")


def _length_mask(tokens, lengths):
    idx = jnp.arange(tokens.shape[-1])
    if lengths is None:
        return jnp.ones(tokens.shape, bool)
    return idx[None, :] < jnp.asarray(lengths)[:, None]


class _EncoderScores:
    """``scores`` and ``__call__`` of a model whose ``encoder`` writes ``phi`` for its ``inside`` layer."""

    def scores(self, tokens, lengths=None):
        tokens = jnp.asarray(tokens)
        if tokens.ndim == 1:  # one sequence [n] (a scalar length, e.g. under vmap): phi [n, n]
            one = None if lengths is None else jnp.asarray(lengths).reshape(1)
            return self.inside.params_dict(), self.encoder(tokens[None], one)[0]
        return self.inside.params_dict(), self.encoder(tokens, lengths)

    def __call__(self, tokens, lengths=None):
        _, phi = self.scores(tokens, lengths)
        return self.inside(tokens, lengths, phi=phi)


class StackingModel(nnx.Module):
    """The score tensors alone (``phi = None``).

    Args: those of :class:`~foldax.layers.nnx_layer.InsideLayer` (``rngs``,
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


class NeuralPhiModel(_EncoderScores, nnx.Module):
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



class LinenNeuralPhiModel(nn.Module):
    """:class:`NeuralPhiModel` in Linen; the DP runs in :func:`~foldax.layers.nnx_layer.LinenInsideLayer`.

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


class _FrozenTables:
    """Constant arrays kept as a static attribute of a module (not state: never trained or
    checkpointed); compared and hashed by content, so that equal models share jit caches."""

    def __init__(self, arrays: Mapping, *, skip: Mapping = ()):
        self.arrays = {k: np.array(v) for k, v in arrays.items()}
        skip = dict(skip)
        self.keep = {}  # per array: False at the flat indices of ``skip`` (entries the prior leaves out)
        for key, value in self.arrays.items():
            keep = np.ones(value.size, bool)
            keep[list(skip.get(key, ()))] = False
            self.keep[key] = keep.reshape(value.shape)
            value.setflags(write=False)
            self.keep[key].setflags(write=False)
        digest = hashlib.sha256()
        for key in sorted(self.arrays):
            digest.update(key.encode())
            digest.update(str(self.arrays[key].dtype).encode())
            digest.update(self.arrays[key].tobytes())
            digest.update(self.keep[key].tobytes())
        self.digest = digest.hexdigest()

    def arrays_of(self, names) -> tuple:
        return tuple(self.arrays[name] for name in names)

    def keep_of(self, names) -> tuple:
        return tuple(self.keep[name] for name in names)

    def __hash__(self):
        return hash(self.digest)

    def __eq__(self, other):
        return isinstance(other, _FrozenTables) and other.digest == self.digest

    def __repr__(self):
        return f"_FrozenTables({len(self.arrays)} arrays, sha256 {self.digest[:12]})"


@jax.jit
def _squared_distance(values, means, keeps):
    """``SUM (value - mean)^2`` over the entries where ``keep`` (one compiled program, also when eager)."""
    total = jnp.zeros((), jnp.result_type(*values))
    for value, mean, keep in zip(values, means, keeps):
        total = total + jnp.sum(jnp.where(keep, jnp.square(value - mean.astype(value.dtype)), 0))
    return total


class TurnerModel(nnx.Module):
    """The Turner energy tables, trainable, with an L2 prior toward their initial values (module docstring).

    Args:
      params: the initial tables: ``"turner2004"`` (default), a mapping of energy tables, or a
        parameter file (``.par``, ``.json``; :func:`foldax.layers.load_params`).
      prior_strength: ``lambda`` of :meth:`prior_penalty` (nats/nt per (kcal/mol)^2; 0: no prior).
      prior_mean: the tables the prior pulls toward (same forms as ``params``; default: ``params``).
      min_hairpin, num_chunks, param_dtype: of the inside layer.
    """

    #: Its log-weights are ``-E(s)/kT``: ``foldax fold --params WORKDIR`` prints kcal/mol, as for its
    #: exported tables (see :mod:`foldax.fold`).
    energy_kT = KT

    def __init__(self, *, params: Mapping | str = "turner2004", prior_strength: float = 0.0,
                 prior_mean: Mapping | str | None = None, min_hairpin: int = 3,
                 num_chunks: int | None = DEFAULT_NUM_CHUNKS, param_dtype=jnp.float32):
        self.inside = InsideLayer(params=params, min_hairpin=min_hairpin, num_chunks=num_chunks,
                                  param_dtype=param_dtype)
        if not self.inside.is_energy:
            raise ValueError(f"{type(self).__name__} needs Turner energy tables ('turner2004', a .par or .json file "
                             f"of energies), got stacking scores")
        prior_strength = float(prior_strength)
        if not (math.isfinite(prior_strength) and prior_strength >= 0):
            raise ValueError(f"prior_strength must be a finite number >= 0, got {prior_strength}")
        self.prior_strength = prior_strength
        anchor = self.inside if prior_mean is None else InsideLayer(
            params=prior_mean, min_hairpin=min_hairpin, num_chunks=num_chunks, param_dtype=param_dtype)
        if (anchor.special_hairpin_sequences != self.inside.special_hairpin_sequences
                or anchor.forbidden != self.inside.forbidden):
            raise ValueError("prior_mean must have the same special hairpins and the same +inf entries as params")
        # The prior's centre, in the layout of the nnx.Params (0 at the +inf entries, which it skips).
        self.prior_mean = _FrozenTables({name: np.asarray(getattr(anchor, name)[...]) for name in self._prior_names()},
                                        skip=dict(self.inside.forbidden))

    def _prior_names(self) -> tuple[str, ...]:
        return self.inside.param_names + ("special_hairpins",)

    def scores(self, tokens, lengths=None):
        return self.inside.params_dict(), None

    def __call__(self, tokens, lengths=None):
        return self.inside(tokens, lengths)

    def prior_penalty(self) -> jax.Array:
        """``prior_strength * SUM (theta - theta_0)^2`` over every finite table entry and special
        hairpin energy (the ``+inf`` entries are not parameters and never enter it)."""
        names = self._prior_names()
        values = tuple(getattr(self.inside, name)[...] for name in names)
        return self.prior_strength * _squared_distance(values, self.prior_mean.arrays_of(names),
                                                       self.prior_mean.keep_of(names))


class TurnerNeuralModel(_EncoderScores, TurnerModel):
    """:class:`TurnerModel` + a :class:`PairEncoder` writing ``phi`` (log-weights), trained jointly.

    Args: those of :class:`TurnerModel`, ``rngs`` (the encoder's initialisation) and the
    encoder's ``features``, ``kernel_size``, ``num_layers``, ``pair_features``. The prior covers the
    tables; the encoder is regularised by ``optimizer.l2`` (:func:`foldax.model.loss.l2_penalty`).
    """

    energy_kT = None  # phi adds log-weights that are no free energy: its structures print as scores

    def __init__(self, *, rngs: nnx.Rngs, features: int = 32, kernel_size: int = 9, num_layers: int = 2,
                 pair_features: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.encoder = PairEncoder(features=features, kernel_size=kernel_size, num_layers=num_layers,
                                   pair_features=pair_features, rngs=rngs)



def grammar_of(config) -> str:
    """``"turner"`` for the Turner models (:data:`TURNER_MODELS`), else ``"stacking"`` (``config.model``)."""
    get = config.get if hasattr(config, "get") else (lambda k, d=None: getattr(config, k, d))
    return "turner" if get("name", "stacking") in TURNER_MODELS else "stacking"


def create_model(config, rngs: nnx.Rngs):
    """The model of ``config`` (``config.model`` of an ``ml_collections`` config, or a mapping).

    Fields: ``name`` (:data:`MODEL_NAMES`), ``init``, ``init_scale``, ``min_hairpin``,
    ``num_chunks`` (0: automatic); for ``neural`` / ``turner_neural`` also ``features``,
    ``kernel_size``, ``num_layers``, ``pair_features``; for the Turner models ``prior_strength``.

    ``init``: for ``stacking`` / ``neural`` ``"random"``, ``"default"``
    (:func:`foldax.layers.default_params`) or a parameter file of stacking scores (``.npz``, ``.json``);
    for the Turner models ``"turner2004"`` or a file of energy tables (``.par``, ``.json``, ``.npz``;
    :func:`foldax.layers.load_params`).
    """
    get = config.get if hasattr(config, "get") else (lambda k, d=None: getattr(config, k, d))
    name = get("name", "stacking")
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model name {name!r}; one of {MODEL_NAMES}")
    num_chunks = get("num_chunks", DEFAULT_NUM_CHUNKS)
    num_chunks = int(num_chunks) if num_chunks else None  # 0 / None: automatic (by length)
    min_hairpin = int(get("min_hairpin", 3))
    encoder = dict(features=int(get("features", 32)), kernel_size=int(get("kernel_size", 9)),
                   num_layers=int(get("num_layers", 2)), pair_features=int(get("pair_features", 16)))
    if name in TURNER_MODELS:
        init = get("init", "turner2004")
        if init in ("", "random", "default"):
            raise ValueError(f"config.model.init = {init!r}: the {name} model starts from energy tables; use "
                             f"'turner2004' or a parameter file (.par, .json)")
        common = dict(params=init, prior_strength=float(get("prior_strength", 0.0)), min_hairpin=min_hairpin,
                      num_chunks=num_chunks)
        if name == "turner":
            return TurnerModel(**common)
        return TurnerNeuralModel(rngs=rngs, **common, **encoder)
    init = get("init", "random")
    if init == "random":
        params = None
    elif init == "default":
        params = "default"
    else:
        from foldax.layers.inside import is_energy_params
        from foldax.layers.params_io import load_params

        params = load_params(init)
        if is_energy_params(params):
            raise ValueError(f"config.model.init = {init!r} holds Turner energy tables; the {name} model takes "
                             f"stacking scores (use model.name = 'turner' for energy tables)")
    common = dict(rngs=rngs, params=params, init_scale=float(get("init_scale", 0.1)), min_hairpin=min_hairpin,
                  num_chunks=num_chunks)
    if name == "stacking":
        return StackingModel(**common)
    return NeuralPhiModel(**common, **encoder)
