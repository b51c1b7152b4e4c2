"""Decoding a model's structures and scoring them against references (evaluation).

Two decoders, both from :mod:`foldax.layers.decoding`:

* ``"mea"`` -- the maximum expected accuracy structure of the base-pair
  probabilities ``P = d log Z / d phi`` (:func:`foldax.layers.decoding.pair_probs`,
  :func:`foldax.layers.decoding.mea_structure`: maximises ``SUM_pairs 2 gamma P_ij +
  SUM_unpaired q_i``; larger ``gamma`` -> more pairs);
* ``"best"`` -- the highest-scoring structure (max semiring traceback,
  :func:`foldax.layers.decoding.best_structure`).

:func:`eval_sums` gives the *sums* over a batch of the per-sequence metrics
(:mod:`foldax.model.metrics`) and the log-likelihood, weighted by the row weights
(padding rows count 0): sums from several batches (and devices/processes)
add up, and :func:`finalize` turns them into means -- per-sequence means for the
accuracy metrics, per-nucleotide for ``ll_per_nt``.
"""

from __future__ import annotations

import jax.numpy as jnp

from foldax.model.loss import batch_nll
from foldax.model.metrics import METRIC_NAMES, pair_metrics

__all__ = ["DECODERS", "predict", "eval_sums", "finalize"]

DECODERS = ("mea", "best")


def predict(model, tokens, lengths, *, decoder: str = "mea", gamma: float = 1.0):
    """Predicted pair tables ``[B, L]`` (-1 padded) of ``model`` for a batch."""
    from foldax.layers.decoding import best_structure, mea_structure, pair_probs  # the decoders live in the engine

    params, phi = model.scores(tokens, lengths)
    kw = dict(min_hairpin=model.inside.min_hairpin, num_chunks=model.inside.num_chunks)
    if decoder == "mea":
        probs = pair_probs(params, tokens, lengths, phi=phi, **kw)
        return mea_structure(probs, lengths, gamma=gamma, **kw)
    if decoder == "best":
        return best_structure(params, tokens, lengths, phi=phi, **kw)
    raise ValueError(f"unknown decoder {decoder!r}; one of {DECODERS}")


def eval_sums(model, batch, *, decoders=DECODERS, gamma: float = 1.0) -> dict:
    """Weighted sums of the evaluation metrics over one batch (scalars; see :func:`finalize`).

    Keys: ``n_seqs``, ``n_tokens``, ``ll_sum`` (sum of ``log p(s|x)`` over the references the
    model can produce), ``ll_tokens`` (their nucleotides), ``n_impossible`` (references with
    probability 0 under the model, e.g. a non-canonical pair for the Turner grammar: left out of
    ``ll_sum``, scored by the accuracy metrics like any other), and for each decoder
    ``<decoder>/<metric>`` for the metrics of :mod:`foldax.model.metrics`.
    """
    weights = batch["weights"].astype(jnp.float32)
    lengths = batch["lengths"]
    log_z, score = batch_nll(model, batch)
    real = weights > 0
    possible = real & jnp.isfinite(score)
    n_tokens = weights * lengths.astype(jnp.float32)
    out = {
        "n_seqs": jnp.sum(weights),
        "n_tokens": jnp.sum(n_tokens),
        "ll_sum": jnp.sum(weights * jnp.where(possible, score - log_z, 0.0)),
        "ll_tokens": jnp.sum(jnp.where(possible, n_tokens, 0.0)),
        "n_impossible": jnp.sum(jnp.where(real & ~possible, weights, 0.0)),
    }
    for decoder in decoders:
        pred = predict(model, batch["tokens"], lengths, decoder=decoder, gamma=gamma)
        for name, values in pair_metrics(pred, batch["pair_table"], lengths).items():
            out[f"{decoder}/{name}"] = jnp.sum(weights * values)
    return out


def finalize(sums: dict) -> dict:
    """Means from (accumulated) :func:`eval_sums`: ``ll_per_nt``, ``<decoder>/<metric>``, ``n_seqs``,
    and ``n_impossible`` when some reference has probability 0 under the model (``ll_per_nt`` is
    then the mean over the others)."""
    sums = {k: float(v) for k, v in sums.items()}
    n_seqs, n_tokens = sums["n_seqs"], sums.get("ll_tokens", sums["n_tokens"])
    out = {"n_seqs": int(round(n_seqs)), "ll_per_nt": sums["ll_sum"] / max(n_tokens, 1.0)}
    if sums.get("n_impossible", 0.0) > 0:
        out["n_impossible"] = int(round(sums["n_impossible"]))
    for key, value in sums.items():
        if "/" in key and key.split("/", 1)[1] in METRIC_NAMES:
            out[key] = value / max(n_seqs, 1.0)
    return out
