"""Base-pair accuracy of predicted structures, per sequence (jit-able, batched).

For one sequence with predicted pairs ``P`` and reference pairs ``T``:

* ``precision = |P ∩ T| / |P|`` (the PPV), ``recall = |P ∩ T| / |T|`` (the
  sensitivity), ``f1 = 2 precision recall / (precision + recall)``;
* with ``slip=True`` (the +-1 allowance of Mathews' scorer, e.g. Mathews 2019,
  *RNA* 25:1048): a predicted pair (i, j) is correct if any of (i, j),
  (i +- 1, j), (i, j +- 1) is a reference pair, and a reference pair is found if
  any of its shifts is predicted; precision and recall count those;
* ``mcc``: Matthews' correlation coefficient of the pair matrix, counting
  every candidate pair ``i < j`` of the sequence (``L (L - 1) / 2`` of them):
  with ``TP = |P ∩ T|``, ``FP = |P| - TP``, ``FN = |T| - TP`` and
  ``TN = L (L - 1) / 2 - TP - FP - FN``,
  ``mcc = (TP TN - FP FN) / sqrt((TP + FP) (TP + FN) (TN + FP) (TN + FN))``
  (exact pairs only). As ``TN`` dwarfs the rest it is close to
  ``sqrt(precision recall)``, the approximation of Gorodkin et al. (2001)
  and Mathews et al. (2004);
* conventions: an empty prediction has precision 1, an empty reference has
  recall 1; f1 is 0 when precision + recall is 0 -- so f1 is 1 when both are
  empty and 0 when exactly one is. mcc is exactly 1 when the prediction equals
  the reference (both empty included) and 0 when its denominator is 0 otherwise.

Scores are averaged *per sequence* (every sequence weighs the same, whatever its
length), as usual in the literature. Inputs are pair tables ``[B, L]``
(partner or -1; entries at or past ``lengths`` are ignored).

>>> import numpy as np
>>> true = np.array([[8, 7, 6, -1, -1, -1, 2, 1, 0]])
>>> pred = np.array([[7, 6, -1, -1, -1, -1, 1, 0, -1]])   # the stem shifted by one
>>> m = pair_metrics(pred, true, np.array([9]))
>>> float(m["f1"][0]), float(m["f1_slip"][0]), round(float(m["mcc"][0]), 4)   # TP 0, FP 2, FN 3, TN 31
(0.0, 1.0, -0.0731)
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["pair_matrix", "pair_metrics", "METRIC_NAMES"]

#: Keys of :func:`pair_metrics` (the first six are the original ones, in their order).
METRIC_NAMES = ("precision", "recall", "f1", "precision_slip", "recall_slip", "f1_slip", "mcc")


def pair_matrix(pair_table, lengths=None):
    """``[B, L, L]`` bool: ``M[b, i, j]`` for each pair ``i < j`` of ``pair_table[b]`` (within the length)."""
    pair_table = jnp.asarray(pair_table)
    batch, length = pair_table.shape
    idx = jnp.arange(length)
    if lengths is None:
        lengths = jnp.full((batch,), length)
    valid = (idx < jnp.asarray(lengths)[:, None]) & (pair_table > idx) & (pair_table < jnp.asarray(lengths)[:, None])
    return valid[:, :, None] & (pair_table[:, :, None] == idx[None, None, :])


def _dilate(m):
    """m | m shifted by +-1 in i | m shifted by +-1 in j (zero fill)."""
    pad = jnp.pad(m, ((0, 0), (1, 1), (1, 1)))
    n = m.shape[1]
    out = m
    for di, dj in ((0, 1), (2, 1), (1, 0), (1, 2)):
        out = out | pad[:, di : di + n, dj : dj + n]
    return out


def _prf(tp_pred, tp_true, n_pred, n_true):
    precision = jnp.where(n_pred > 0, tp_pred / jnp.maximum(n_pred, 1), 1.0)
    recall = jnp.where(n_true > 0, tp_true / jnp.maximum(n_true, 1), 1.0)
    total = precision + recall
    f1 = jnp.where(total > 0, 2 * precision * recall / jnp.where(total > 0, total, 1.0), 0.0)
    return precision, recall, f1


def _mcc(tp, n_pred, n_true, lengths):
    """Matthews' correlation over the ``L (L - 1) / 2`` candidate pairs (see the module docstring)."""
    n = lengths.astype(jnp.float32)
    fp, fn = n_pred - tp, n_true - tp
    tn = n * (n - 1) / 2 - tp - fp - fn
    # a product of square roots: the plain product of the four factors reaches 1e19 at L = 3000
    denom = jnp.sqrt(tp + fp) * jnp.sqrt(tp + fn) * jnp.sqrt(tn + fp) * jnp.sqrt(tn + fn)
    mcc = jnp.clip((tp * tn - fp * fn) / jnp.where(denom > 0, denom, 1.0), -1.0, 1.0)
    # pred == true is exactly 1 (also when both are empty: a zero denominator); other zero denominators: 0
    return jnp.where((fp == 0) & (fn == 0), 1.0, jnp.where(denom > 0, mcc, 0.0))


def pair_metrics(pred_table, true_table, lengths=None) -> dict:
    """Per-sequence ``precision recall f1``, their ``*_slip`` forms and ``mcc``, each float32 ``[B]``."""
    pred = pair_matrix(pred_table, lengths)
    true = pair_matrix(true_table, lengths)
    n_pred = pred.sum((1, 2)).astype(jnp.float32)
    n_true = true.sum((1, 2)).astype(jnp.float32)
    exact = (pred & true).sum((1, 2)).astype(jnp.float32)
    p, r, f = _prf(exact, exact, n_pred, n_true)
    tp_pred = (pred & _dilate(true)).sum((1, 2)).astype(jnp.float32)
    tp_true = (true & _dilate(pred)).sum((1, 2)).astype(jnp.float32)
    ps, rs, fs = _prf(tp_pred, tp_true, n_pred, n_true)
    if lengths is None:
        lengths = jnp.full(pred.shape[:1], pred.shape[1])
    mcc = _mcc(exact, n_pred, n_true, jnp.asarray(lengths))
    return {"precision": p, "recall": r, "f1": f, "precision_slip": ps, "recall_slip": rs, "f1_slip": fs,
            "mcc": mcc}
