"""The inside algorithm as a Flax layer: :class:`InsideLayer` (NNX) and its Linen form.

:class:`InsideLayer` owns the four score tensors of the grammar (see
:mod:`layers.chart`) as ``nnx.Param`` s and computes ``log Z(x)`` with
:func:`layers.log_partition`:

=============  ==================  ==============================================
param          shape               score of
=============  ==================  ==============================================
``stack``      ``[5, 5, 5, 5]``    pair (i, j) stacked on (i+1, j-1):
                                   ``stack[x_i, x_j, x_{j-1}, x_{i+1}]``
``pair``       ``[5, 5]``          every pair (i, j): ``pair[x_i, x_j]``
``unpaired``   ``[5]``             every unpaired base ``unpaired[x_i]``
``loop``       ``[]``              a pair closing a loop (not stacked)
=============  ==================  ==============================================

Initialisation (pick one):

* ``InsideLayer(rngs=nnx.Rngs(0))`` -- every entry i.i.d. ``N(0, init_scale^2)``
  (``init_scale=0.1``), drawn from the ``params`` stream exactly as
  :func:`layers.init_params` ``(rngs.params(), scale=init_scale)``;
* ``InsideLayer(params=layers.default_params())`` -- from given arrays (any
  mapping with the four keys, e.g. a loaded ``.npz``); ``params="default"`` is
  a shortcut for :func:`layers.default_params`.

``min_hairpin`` and ``num_chunks`` are static (plain Python attributes, part of
the graph definition, never traced). Fewer ``num_chunks`` compile faster
(each chunk costs ~0.4 s of compile time per batch shape and gradient; training
uses 4, at about the same step time for ``L <= 256``); the default ``None`` is
:func:`layers.log_partition`'s automatic choice by length.

The Linen form, :func:`LinenInsideLayer` (``flax.nnx.bridge.to_linen``),
takes the same constructor arguments as Linen attributes and keeps the
tensors in the ``params`` collection::

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens, lengths):
            phi = ...                                   # [B, L, L] from any Linen layers
            return LinenInsideLayer(min_hairpin=3, name="inside")(tokens, lengths, phi=phi)

>>> import layers
>>> layer = InsideLayer(params="default")
>>> float(layer(layers.encode("GGGAAACCC"))) > 0
True
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from layers.chart import DEFAULT_NUM_CHUNKS
from layers.inside import PARAM_SHAPES, check_params, log_partition, max_score
from layers.params import default_params, init_params

__all__ = ["InsideLayer", "LinenInsideLayer", "PARAM_NAMES"]

#: The score tensors, in the order of :data:`layers.inside.PARAM_SHAPES`.
PARAM_NAMES = tuple(PARAM_SHAPES)


class InsideLayer(nnx.Module):
    """``log Z(x)`` of the nested-structure grammar with trainable score tensors.

    Args:
      rngs: ``nnx.Rngs`` for random initialisation (its ``params`` stream);
        ignored when ``params`` is given.
      params: initial values instead (a mapping with ``stack pair unpaired
        loop``, or ``"default"`` for :func:`layers.default_params`).
      init_scale: standard deviation of the random initialisation.
      min_hairpin: static ``h``: a pair (i, j) needs ``j - i > h``.
      num_chunks: static; see :func:`layers.log_partition`.
      param_dtype: dtype of the tensors (float32 default; float64 needs x64).
    """

    def __init__(
        self,
        *,
        rngs: nnx.Rngs | None = None,
        params: Mapping | str | None = None,
        init_scale: float = 0.1,
        min_hairpin: int = 3,
        num_chunks: int | None = DEFAULT_NUM_CHUNKS,
        param_dtype=jnp.float32,
    ):
        if isinstance(params, str):
            if params != "default":
                raise ValueError(f"params must be a mapping or 'default', got {params!r}")
            values = default_params(param_dtype)
        elif params is not None:
            values = {k: jnp.asarray(v, param_dtype) for k, v in check_params(params).items()}
        else:
            if rngs is None:
                raise ValueError("InsideLayer needs rngs (random init) or params (given values)")
            values = init_params(rngs.params(), scale=init_scale, dtype=param_dtype)
        if not isinstance(min_hairpin, int) or isinstance(min_hairpin, bool) or min_hairpin < 0:
            raise ValueError(f"min_hairpin must be a non-negative int, got {min_hairpin!r}")
        self.min_hairpin = min_hairpin
        self.num_chunks = None if num_chunks is None else int(num_chunks)  # None: automatic (by length)
        self.stack = nnx.Param(values["stack"])
        self.pair = nnx.Param(values["pair"])
        self.unpaired = nnx.Param(values["unpaired"])
        self.loop = nnx.Param(values["loop"])

    def params_dict(self) -> dict[str, jax.Array]:
        """The current tensors as a plain dict (the format of :func:`layers.log_partition`)."""
        return {name: getattr(self, name)[...] for name in PARAM_NAMES}

    def __call__(self, tokens, lengths=None, *, phi=None):
        """``log Z`` of ``tokens`` (``[n]`` -> scalar, ``[B, L]`` -> ``[B]``); ``phi``: extra pair scores."""
        return log_partition(
            self.params_dict(), tokens, lengths, phi=phi, min_hairpin=self.min_hairpin, num_chunks=self.num_chunks
        )

    def max_score(self, tokens, lengths=None, *, phi=None):
        """The best structure's score (max semiring), same arguments as ``__call__``."""
        return max_score(
            self.params_dict(), tokens, lengths, phi=phi, min_hairpin=self.min_hairpin, num_chunks=self.num_chunks
        )

    def structure_score(self, tokens, pair_table, lengths=None, *, phi=None):
        """``score(s)`` of given structures (:func:`layers.structure.structure_score`)."""
        from layers.structure import structure_score

        return structure_score(self.params_dict(), tokens, pair_table, lengths, phi=phi, min_hairpin=self.min_hairpin)

    def log_prob(self, tokens, pair_table, lengths=None, *, phi=None):
        """``log p(s | x) = score(s) - log Z(x)`` (:func:`layers.structure.log_prob`)."""
        from layers.structure import log_prob

        return log_prob(
            self.params_dict(), tokens, pair_table, lengths, phi=phi, min_hairpin=self.min_hairpin,
            num_chunks=self.num_chunks,
        )


def LinenInsideLayer(*, name: str | None = None, **kwargs) -> nnx.bridge.ToLinen:  # noqa: N802 (a Linen module "class")
    """The Linen form of :class:`InsideLayer`: ``nnx.bridge.to_linen(InsideLayer, **kwargs)``.

    Takes :class:`InsideLayer`'s keyword arguments (``min_hairpin=``,
    ``init_scale=``, ``params=``, ``num_chunks=``, ``param_dtype=``) plus Linen's
    ``name=``. Call it like the NNX layer, ``(tokens, lengths, phi=phi)``, or
    ``.max_score(...)``. The tensors live in the ``params`` collection under
    ``name`` (``stack pair unpaired loop``); random init draws from Linen's
    ``params`` rng.
    """
    return nnx.bridge.to_linen(InsideLayer, name=name, **kwargs)
