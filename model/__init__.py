"""foldax models: scoring models on the inside layer, the CLL loss, decoding and metrics.

* :mod:`foldax.model.models` -- :class:`StackingModel`, :class:`NeuralPhiModel`
  (a neural encoder writing pair potentials ``phi``), :class:`LinenNeuralPhiModel`,
  :class:`TurnerModel` and :class:`TurnerNeuralModel` (the Turner 2004 energy tables, with a
  prior toward their initial values), :func:`create_model`.
* :mod:`foldax.model.loss` -- :func:`cll_loss` (negative log-likelihood per nucleotide, + L2 or the
  model's prior), :func:`cll_step` (one optimizer step on it), :func:`expected_f1_loss` (one minus
  the expected F1 of the pair probabilities), :func:`get_loss` (``config.loss`` -> loss).
* :mod:`foldax.model.decoding` -- :func:`predict` (MEA / best structure) and the evaluation sums.
* :mod:`foldax.model.metrics` -- per-sequence base-pair precision / recall / F1 (exact and +-1 slip).
"""

from foldax.model.decoding import DECODERS, eval_sums, finalize, predict
from foldax.model.loss import LOSSES, batch_nll, cll_loss, cll_step, expected_f1_loss, get_loss, l2_penalty
from foldax.model.metrics import METRIC_NAMES, pair_matrix, pair_metrics
from foldax.model.models import (
    LinenNeuralPhiModel,
    NeuralPhiModel,
    PairEncoder,
    StackingModel,
    TurnerModel,
    TurnerNeuralModel,
    create_model,
    grammar_of,
)

__all__ = [
    "DECODERS",
    "eval_sums",
    "finalize",
    "predict",
    "batch_nll",
    "cll_loss",
    "cll_step",
    "l2_penalty",
    "LOSSES",
    "expected_f1_loss",
    "get_loss",
    "METRIC_NAMES",
    "pair_matrix",
    "pair_metrics",
    "LinenNeuralPhiModel",
    "NeuralPhiModel",
    "PairEncoder",
    "StackingModel",
    "TurnerModel",
    "TurnerNeuralModel",
    "create_model",
    "grammar_of",
]
