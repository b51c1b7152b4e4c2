"""The inside algorithm as a Flax layer, for either grammar: :class:`InsideLayer` (NNX) and its Linen form.

:class:`InsideLayer` owns a grammar's parameters as ``nnx.Param`` s and offers every function
of :mod:`foldax.layers` as a method, with its own parameters filled in. The parameters pick the
grammar (as everywhere in :mod:`foldax.layers`):

* **stacking** (``InsideLayer(rngs=nnx.Rngs(0))`` or ``params="default"``): the four score
  tensors of :mod:`foldax.layers.stacking`, natural-log scores:

  =============  ==================  ==============================================
  param          shape               score of
  =============  ==================  ==============================================
  ``stack``      ``[5, 5, 5, 5]``    pair (i, j) stacked on (i+1, j-1):
                                     ``stack[x_i, x_j, x_{j-1}, x_{i+1}]``
  ``pair``       ``[5, 5]``          every pair (i, j): ``pair[x_i, x_j]``
  ``unpaired``   ``[5]``             every unpaired base ``unpaired[x_i]``
  ``loop``       ``[]``              a pair closing a loop (not stacked)
  =============  ==================  ==============================================

* **Turner 2004** (``InsideLayer(params="turner2004")``, or any energy tables, e.g. a ``.par``
  file's path): every table of :mod:`foldax.layers.energy_params` (kcal/mol; ``stack [6, 6]``,
  ``int22 [6, 6, 5, 5, 5, 5]``, ``hairpin [31]``, ``ml_closing []``, ...) is an
  ``nnx.Param`` of the same name, and the special hairpin energies are one ``nnx.Param``
  vector ``special_hairpins [K]`` whose entries belong to the loops
  ``special_hairpin_sequences`` (a static tuple). The log-weight of a structure is
  ``-E(s)/kT + SUM phi`` (``layers.KT``).

  Entries that are ``+inf`` in the given tables (loops the model forbids, e.g.
  ``hairpin[0:3]``) are not parameters: their places are recorded in the static attribute
  ``forbidden`` and their ``nnx.Param`` entries hold 0, which nothing reads (their gradient is
  exactly 0). So every ``nnx.Param`` is finite -- Adam, weight decay, an L2 penalty or gradient
  clipping see no ``inf`` -- while :meth:`InsideLayer.params_dict` gives the tables with their
  ``+inf`` entries back.

Methods (``tokens`` ``[n]`` or ``[B, L]`` with ``lengths``, optional ``phi``; see the functions
of the same names in :mod:`foldax.layers`): ``__call__`` (``log Z``), :meth:`~InsideLayer.max_score`,
:meth:`~InsideLayer.structure_score`, :meth:`~InsideLayer.log_prob`,
:meth:`~InsideLayer.pair_probs`, :meth:`~InsideLayer.best_structure`,
:meth:`~InsideLayer.mea_structure`, :meth:`~InsideLayer.sample_structures` and, for Turner
tables, :meth:`~InsideLayer.free_energy` and :meth:`~InsideLayer.ensemble_free_energy`
(kcal/mol).

Initialisation (pick one):

* ``InsideLayer(rngs=nnx.Rngs(0))`` -- stacking scores i.i.d. ``N(0, init_scale^2)``
  (``init_scale=0.1``), drawn from the ``params`` stream exactly as
  :func:`foldax.layers.init_params` ``(rngs.params(), scale=init_scale)``;
* ``InsideLayer(params=...)`` -- from given values: a mapping (either grammar, e.g.
  :func:`foldax.layers.turner2004` ``()``), or a name or file for :func:`foldax.layers.load_params`
  (``"default"``, ``"turner2004"``, ``.json``, ``.npz``, ``.par``).

``min_hairpin``, ``num_chunks`` and ``no_lonely_pairs`` are static (plain Python attributes, part
of the graph definition, never traced). Fewer ``num_chunks`` compile faster; the default ``None`` is
:func:`foldax.layers.log_partition`'s automatic choice by length. ``no_lonely_pairs=True`` (Turner
tables only; RNAfold's ``--noLP``) restricts every ensemble method to the structures without
lonely pairs; :meth:`~InsideLayer.structure_score` and :meth:`~InsideLayer.free_energy` score any
structure, and :meth:`~InsideLayer.mea_structure` decodes the restricted pair probabilities.

The Linen form, :func:`LinenInsideLayer` (``flax.nnx.bridge.to_linen``), takes the same
constructor arguments as Linen attributes and keeps the parameters in the ``params``
collection; its methods are reached with ``apply(..., method=...)``::

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens, lengths):
            phi = ...                                   # [B, L, L] from any Linen layers
            return LinenInsideLayer(params="turner2004", name="inside")(tokens, lengths, phi=phi)

>>> from foldax import layers
>>> layer = InsideLayer(params="default")
>>> float(layer(layers.encode("GGGAAACCC"))) > 0
True
>>> turner = InsideLayer(params="turner2004")
>>> x = layers.encode("GGGGAAACCCC")
>>> layers.to_dot_bracket(turner.best_structure(x)), round(float(turner.free_energy(x, "((((...))))")), 2)
('((((...))))', -4.5)
>>> float(turner.hairpin[...][0]), float(turner.params_dict()["hairpin"][0])
(0.0, inf)
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from foldax.layers import decoding as _decoding
from foldax.layers.free_energy import ensemble_free_energy as _ensemble_free_energy
from foldax.layers.free_energy import free_energy as _free_energy
from foldax.layers import structure as _structure
from foldax.layers.chart import DEFAULT_NUM_CHUNKS
from foldax.layers.energy_params import SCALAR_NAMES, TABLE_SHAPES
from foldax.layers.inside import (
    PARAM_SHAPES,
    check_no_lonely_pairs,
    check_params,
    is_energy_params,
    log_partition,
    max_score,
)
from foldax.layers.params import init_params

__all__ = ["InsideLayer", "LinenInsideLayer", "PARAM_NAMES", "TURNER_PARAM_NAMES"]

#: The stacking grammar's score tensors, in the order of :data:`foldax.layers.inside.PARAM_SHAPES`.
PARAM_NAMES = tuple(PARAM_SHAPES)
#: The Turner tables held as ``nnx.Param`` (plus the vector ``special_hairpins``).
TURNER_PARAM_NAMES = tuple(TABLE_SHAPES) + tuple(SCALAR_NAMES)


def _initial_values(params, rngs, init_scale, dtype) -> dict:
    """The starting parameters as a checked dict of ``dtype`` arrays (either grammar)."""
    if isinstance(params, str):
        from foldax.layers.params_io import load_params

        return load_params(params, dtype=dtype)
    if params is not None:
        values = check_params(params)
        if is_energy_params(values):
            return {k: ({s: jnp.asarray(e, dtype) for s, e in v.items()} if k == "special_hairpins"
                        else jnp.asarray(v, dtype)) for k, v in values.items()}
        return {k: jnp.asarray(v, dtype) for k, v in values.items()}
    if rngs is None:
        raise ValueError("InsideLayer needs rngs (random stacking scores) or params (given values, a name such as "
                         "'turner2004' or a parameter file)")
    return init_params(rngs.params(), scale=init_scale, dtype=dtype)


def _forbidden_entries(name: str, value) -> tuple[int, ...]:
    """Flat indices of the +inf entries of one table; NaN and -inf are refused."""
    value = np.asarray(value)
    if np.isnan(value).any() or (value == -np.inf).any():
        raise ValueError(f"energy table {name!r} holds NaN or -inf; only +inf (a forbidden loop) is allowed")
    return tuple(int(i) for i in np.flatnonzero(value.reshape(-1) == np.inf))


class InsideLayer(nnx.Module):
    """A grammar's parameters as ``nnx.Param`` s, with the DP's functions as methods (module docstring).

    Args:
      rngs: ``nnx.Rngs`` for random stacking scores (its ``params`` stream); ignored when
        ``params`` is given.
      params: initial values instead: a mapping of either grammar (stacking scores, or Turner
        energy tables such as :func:`foldax.layers.turner2004` ``()``), or a name / file for
        :func:`foldax.layers.load_params` (``"default"``, ``"turner2004"``, ``.json``, ``.npz``, ``.par``).
      init_scale: standard deviation of the random initialisation.
      min_hairpin: static ``h``: a pair (i, j) needs ``j - i > h``.
      num_chunks: static; see :func:`foldax.layers.log_partition`.
      no_lonely_pairs: static; Turner tables only (see :func:`foldax.layers.log_partition`).
      param_dtype: dtype of the parameters (float32 default; float64 needs x64).

    Attributes (static): ``grammar`` (``"stacking"`` or ``"turner"``), ``param_names`` (the
    ``nnx.Param`` attributes), and for Turner tables ``special_hairpin_sequences`` and
    ``forbidden`` (``((table, (flat index, ...)), ...)``, the ``+inf`` entries).
    """

    def __init__(
        self,
        *,
        rngs: nnx.Rngs | None = None,
        params: Mapping | str | None = None,
        init_scale: float = 0.1,
        min_hairpin: int = 3,
        num_chunks: int | None = DEFAULT_NUM_CHUNKS,
        no_lonely_pairs: bool = False,
        param_dtype=jnp.float32,
    ):
        values = _initial_values(params, rngs, init_scale, param_dtype)
        if not isinstance(min_hairpin, int) or isinstance(min_hairpin, bool) or min_hairpin < 0:
            raise ValueError(f"min_hairpin must be a non-negative int, got {min_hairpin!r}")
        self.min_hairpin = min_hairpin
        self.no_lonely_pairs = check_no_lonely_pairs(values, no_lonely_pairs)
        self.num_chunks = None if num_chunks is None else int(num_chunks)  # None: automatic (by length)
        if is_energy_params(values):
            self.grammar = "turner"
            self.param_names = TURNER_PARAM_NAMES
            forbidden = []
            for name in TURNER_PARAM_NAMES:  # (numpy here: no small XLA programs to compile at construction)
                value = np.asarray(values[name])
                entries = _forbidden_entries(name, value)
                if entries:
                    forbidden.append((name, entries))
                    value = np.where(np.isinf(value), 0, value)
                setattr(self, name, nnx.Param(jnp.asarray(value, param_dtype)))
            self.forbidden = tuple(forbidden)
            special = values["special_hairpins"]
            self.special_hairpin_sequences = tuple(special)
            energies = np.array([np.asarray(special[s]) for s in self.special_hairpin_sequences], np.float64)
            if not np.isfinite(energies).all():
                raise ValueError("special hairpin energies must be finite")
            self.special_hairpins = nnx.Param(jnp.asarray(energies.reshape(-1), param_dtype))
        else:
            self.grammar = "stacking"
            self.param_names = PARAM_NAMES
            self.forbidden = ()
            self.special_hairpin_sequences = ()
            for name in PARAM_NAMES:
                setattr(self, name, nnx.Param(jnp.asarray(values[name], param_dtype)))

    @property
    def is_energy(self) -> bool:
        """True for Turner energy tables (free energies, kcal/mol)."""
        return self.grammar == "turner"

    def params_dict(self) -> dict:
        """The current parameters in the format of :mod:`foldax.layers` (Turner: ``+inf`` entries restored,
        ``special_hairpins`` as ``{sequence: energy}``)."""
        out = {name: getattr(self, name)[...] for name in self.param_names}
        for name, entries in self.forbidden:
            value = out[name]
            mask = np.zeros(value.size, bool)
            mask[list(entries)] = True
            out[name] = jnp.where(mask.reshape(value.shape), jnp.asarray(jnp.inf, value.dtype), value)
        if self.grammar == "turner":
            energies = jnp.unstack(self.special_hairpins[...]) if self.special_hairpin_sequences else ()
            out["special_hairpins"] = dict(zip(self.special_hairpin_sequences, energies))
        return out

    def _kw(self, chunks: bool = True, ensemble: bool = True) -> dict:
        """The static options: ``min_hairpin``, with ``chunks`` the DP's ``num_chunks``, with
        ``ensemble`` (and ``chunks``) also ``no_lonely_pairs``, which shapes the ensemble."""
        kw = {"min_hairpin": self.min_hairpin}
        if chunks:
            kw["num_chunks"] = self.num_chunks
            if ensemble:
                kw["no_lonely_pairs"] = self.no_lonely_pairs
        return kw

    def __call__(self, tokens, lengths=None, *, phi=None):
        """``log Z`` of ``tokens`` (``[n]`` -> scalar, ``[B, L]`` -> ``[B]``); ``phi``: extra pair log-weights."""
        return log_partition(self.params_dict(), tokens, lengths, phi=phi, **self._kw())

    def max_score(self, tokens, lengths=None, *, phi=None):
        """The best structure's score (max semiring); for Turner tables ``-MFE/kT`` (+ its ``phi``)."""
        return max_score(self.params_dict(), tokens, lengths, phi=phi, **self._kw())

    def structure_score(self, tokens, pair_table, lengths=None, *, phi=None):
        """``score(s)`` of given structures (:func:`foldax.layers.structure_score`; Turner: ``-E(s)/kT``)."""
        return _structure.structure_score(self.params_dict(), tokens, pair_table, lengths, phi=phi,
                                         **self._kw(chunks=False))

    def log_prob(self, tokens, pair_table, lengths=None, *, phi=None):
        """``log p(s | x) = score(s) - log Z(x)`` (:func:`foldax.layers.log_prob`)."""
        return _structure.log_prob(self.params_dict(), tokens, pair_table, lengths, phi=phi, **self._kw())

    def pair_probs(self, tokens, lengths=None, *, phi=None):
        """Base-pair probabilities ``[n, n]`` / ``[B, L, L]`` (:func:`foldax.layers.pair_probs`)."""
        return _decoding.pair_probs(self.params_dict(), tokens, lengths, phi=phi, **self._kw())

    def best_structure(self, tokens, lengths=None, *, phi=None):
        """The highest-scoring structure as a pair table (:func:`foldax.layers.best_structure`; Turner: the MFE)."""
        return _decoding.best_structure(self.params_dict(), tokens, lengths, phi=phi, **self._kw())

    def mea_structure(self, tokens, lengths=None, *, phi=None, gamma=1.0):
        """The maximum expected accuracy structure of this layer's pair probabilities
        (:func:`foldax.layers.mea_structure` of :meth:`pair_probs`)."""
        probs = self.pair_probs(tokens, lengths, phi=phi)
        return _decoding.mea_structure(probs, lengths, gamma=gamma, **self._kw(ensemble=False))

    def sample_structures(self, key, tokens, num_samples, lengths=None, *, phi=None):
        """``num_samples`` exact samples from ``p(s | x)`` (:func:`foldax.layers.sample_structures`)."""
        return _decoding.sample_structures(key, self.params_dict(), tokens, num_samples, lengths, phi=phi,
                                          **self._kw())

    def free_energy(self, tokens, structure, lengths=None):
        """``E(s)`` in kcal/mol (:func:`foldax.layers.free_energy`); Turner tables only."""
        self._require_energy("free_energy")
        return _free_energy(self.params_dict(), tokens, structure, lengths)

    def ensemble_free_energy(self, tokens, lengths=None, *, phi=None):
        """``-kT log Z`` in kcal/mol (:func:`foldax.layers.ensemble_free_energy`); Turner tables only."""
        self._require_energy("ensemble_free_energy")
        return _ensemble_free_energy(self.params_dict(), tokens, lengths, phi=phi, **self._kw())

    def _require_energy(self, what: str) -> None:
        if not self.is_energy:
            raise TypeError(f"InsideLayer.{what} needs Turner energy tables (InsideLayer(params='turner2004')); "
                            f"this layer holds stacking scores, which are not energies")


def LinenInsideLayer(*, name: str | None = None, **kwargs) -> nnx.bridge.ToLinen:  # noqa: N802 (a Linen module "class")
    """The Linen form of :class:`InsideLayer`: ``nnx.bridge.to_linen(InsideLayer, **kwargs)``.

    Takes :class:`InsideLayer`'s keyword arguments (``params=`` -- e.g. ``"turner2004"`` --,
    ``min_hairpin=``, ``init_scale=``, ``num_chunks=``, ``no_lonely_pairs=``, ``param_dtype=``) plus
    Linen's ``name=``.
    Call it like the NNX layer, ``(tokens, lengths, phi=phi)``, or any method through
    ``apply(..., method=lambda m, *a: m.pair_probs(*a))`` (inside a compact module:
    ``layer.pair_probs(...)``). The parameters live in the ``params`` collection under ``name``
    (stacking: ``stack pair unpaired loop``; Turner: one array per table plus ``special_hairpins``);
    random init draws from Linen's ``params`` rng.
    """
    return nnx.bridge.to_linen(InsideLayer, name=name, **kwargs)
