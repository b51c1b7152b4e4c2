r"""Training losses: the conditional log-likelihood (CLL) and an expected-F1 surrogate.

For a batch of sequences ``x_b`` with reference structures ``s_b`` (pair tables
``[B, L]``, -1 padded) and row weights ``w_b`` (0 for padding rows)::

    nll_b = log Z(x_b) - score(x_b, s_b)            (= -log p(s_b | x_b) >= 0)
    loss  = SUM_b w_b nll_b / SUM_b w_b n_b  +  l2 * SUM_params ||theta||^2

**Normalisation: per nucleotide.** The data term is the negative
log-likelihood per nucleotide over the batch's real tokens (``n_b`` =
``lengths[b]``), so long sequences weigh in proportion to their length, and
the loss value is comparable across batches, buckets and datasets
(``-loss`` without L2 is the log-likelihood per nucleotide, the ``ll_per_nt``
metric). With the batch sharded over devices (``jax.sharding``) the sums are
global, so the loss of a global batch is the same on 1 or 8 devices.

The L2 term covers every ``nnx.Param`` of the model (score tensors and, for
the neural model, the encoder) -- except the energy tables of a model with a
prior (:class:`foldax.model.models.TurnerModel`, ``TurnerNeuralModel``): those are
pulled toward their initial values by the model's own ``prior_penalty()``
(``prior_strength * SUM (theta - theta_0)^2`` over the finite entries, in the
same per-nucleotide units), which ``cll_loss`` adds instead::

    loss = SUM_b w_b nll_b / SUM_b w_b n_b  +  l2 * SUM_{theta not a table} ||theta||^2  +  prior

A reference structure the model gives probability 0 -- not nested, or with a
hairpin shorter than ``min_hairpin`` -- has score ``-inf`` under ``jit``, so
the loss is ``inf``; ``aux["n_invalid"]`` counts such rows (the trainer stops
with a message naming the cause; clean the data, e.g.
``data.short_hairpins = "remove"``).

**Expected F1** (:func:`expected_f1_loss`, ``config.loss = "expected_f1"``): one minus the
mean over sequences of a smooth F1 of the pair probabilities ``P = pair_probs(x_b)``
against the reference pairs ``R_b``::

    F1_b = 2 SUM_{(i,j) in R_b} P_ij / ( SUM_{i<j} P_ij + |R_b| )
    loss = 1 - SUM_b w_b F1_b / SUM_b w_b  +  the same L2 and prior as above

``SUM_{(i,j) in R} P_ij`` is the expected number of true positives and ``SUM_{i<j} P_ij``
the expected number of predicted pairs, so this is the F1 of a decoder that predicts each
pair with its probability. Unlike the CLL, it does not ask the model to make unpaired the
positions a reference leaves unpaired beyond what the pairs it predicts cost in precision.
Its gradient is a gradient through ``pair_probs`` (a Hessian-vector product of ``log Z``,
about 3x the CLL's cost; O(L^2) memory). Rows without reference pairs get weight 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from foldax.layers.decoding import pair_probs
from foldax.layers.inside import log_partition
from foldax.layers.structure import structure_score
from foldax.model.metrics import pair_matrix

__all__ = ["LOSSES", "batch_nll", "cll_loss", "cll_step", "expected_f1_loss", "get_loss", "l2_penalty"]


def batch_nll(model, batch):
    """Per-sequence ``(log Z [B], score [B])`` of a batch dict (``tokens lengths pair_table``)."""
    tokens, lengths = batch["tokens"], batch["lengths"]
    params, phi = model.scores(tokens, lengths)
    inside = model.inside
    log_z = log_partition(params, tokens, lengths, phi=phi, min_hairpin=inside.min_hairpin,
                          num_chunks=inside.num_chunks)
    score = structure_score(params, tokens, batch["pair_table"], lengths, phi=phi, min_hairpin=inside.min_hairpin)
    return log_z, score


def l2_penalty(model) -> jax.Array:
    """``SUM ||theta||^2`` over every ``nnx.Param`` of ``model`` (but the tables of a model with a
    ``prior_penalty``, which has its own prior; see the module docstring)."""
    params = nnx.Param
    if hasattr(model, "prior_penalty"):
        params = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("inside")))
    leaves = jax.tree.leaves(nnx.state(model, params))
    return sum((jnp.sum(jnp.square(x)) for x in leaves), jnp.zeros((), jnp.float32))


def _regularised(model, data_loss, l2):
    """``(data_loss + L2 + the model's prior, prior)``."""
    prior = model.prior_penalty() if hasattr(model, "prior_penalty") else jnp.zeros((), data_loss.dtype)
    return data_loss + (l2 * l2_penalty(model) if l2 else 0.0) + prior, prior


def cll_loss(model, batch, l2: float = 0.0):
    """``(loss, aux)``: the CLL loss per nucleotide (module docstring) and its parts.

    ``aux``: ``nll_sum`` (sum of ``w_b nll_b``), ``n_tokens`` (sum of ``w_b n_b``),
    ``n_seqs`` (sum of ``w_b``), ``n_invalid`` (real rows with score ``-inf``),
    ``data_loss`` (the loss without L2 and prior), ``prior`` (the model's prior penalty, 0 without).
    """
    weights = batch["weights"].astype(jnp.float32)
    log_z, score = batch_nll(model, batch)
    real = weights > 0
    nll = jnp.where(real, log_z - score, 0.0)  # padding rows (length 0) contribute nothing
    nll_sum = jnp.sum(weights * nll)
    n_tokens = jnp.sum(weights * batch["lengths"].astype(jnp.float32))
    data_loss = nll_sum / jnp.maximum(n_tokens, 1.0)
    loss, prior = _regularised(model, data_loss, l2)
    aux = {
        "nll_sum": nll_sum,
        "n_tokens": n_tokens,
        "n_seqs": jnp.sum(weights),
        "n_invalid": jnp.sum(real & ~jnp.isfinite(score)),
        "data_loss": data_loss,
        "prior": prior,
    }
    return loss, aux


def expected_f1_loss(model, batch, l2: float = 0.0):
    """``(loss, aux)``: one minus the mean expected F1 of the pair probabilities (module docstring).

    ``aux`` as :func:`cll_loss`'s, with ``expected_f1`` (the weighted mean ``F1_b``) and
    ``data_loss = 1 - expected_f1``; ``nll_sum`` is not computed (0), ``n_invalid`` is 0
    (a reference pair the model cannot form has probability 0, which is a finite loss).

    Example:
      >>> import jax.numpy as jnp
      >>> from foldax import layers, model as fm
      >>> m = fm.TurnerModel()
      >>> batch = {"tokens": layers.encode("GGGGAAACCCC")[None], "lengths": jnp.array([11]),
      ...          "pair_table": jnp.asarray(layers.from_dot_bracket("((((...))))"))[None], "weights": jnp.ones(1)}
      >>> loss, aux = fm.expected_f1_loss(m, batch)
      >>> bool(0 < float(aux["expected_f1"]) < 1), bool(abs(float(loss) + float(aux["expected_f1"]) - 1) < 1e-6)
      (True, True)
    """
    tokens, lengths = batch["tokens"], batch["lengths"]
    params, phi = model.scores(tokens, lengths)
    inside = model.inside
    probs = pair_probs(params, tokens, lengths, phi=phi, min_hairpin=inside.min_hairpin,
                       num_chunks=inside.num_chunks)
    dtype = probs.dtype
    ref = pair_matrix(batch["pair_table"], lengths)  # [B, L, L], i < j
    hits = jnp.sum(jnp.where(ref, probs, 0.0), axis=(1, 2))
    n_ref = jnp.sum(ref, axis=(1, 2)).astype(dtype)
    n_pred = 0.5 * jnp.sum(probs, axis=(1, 2))  # P is symmetric: each pair (i < j) twice
    f1 = 2 * hits / jnp.maximum(n_pred + n_ref, 1e-6)
    weights = jnp.where(n_ref > 0, batch["weights"].astype(dtype), 0.0)
    expected_f1 = jnp.sum(weights * f1) / jnp.maximum(jnp.sum(weights), 1.0)
    data_loss = 1.0 - expected_f1
    loss, prior = _regularised(model, data_loss, l2)
    aux = {
        "nll_sum": jnp.zeros((), dtype),
        "n_tokens": jnp.sum(batch["weights"].astype(dtype) * lengths.astype(dtype)),
        "n_seqs": jnp.sum(weights),
        "n_invalid": jnp.zeros((), jnp.int32),
        "data_loss": data_loss,
        "expected_f1": expected_f1,
        "prior": prior,
    }
    return loss, aux


#: ``config.loss`` -> (loss function, the name of its data term in the training metrics).
LOSSES = {"cll": (cll_loss, "nll_per_nt"), "expected_f1": (expected_f1_loss, "expected_f1")}


def get_loss(name: str):
    """``(loss function, metric name)`` of ``config.loss`` (``"cll"`` or ``"expected_f1"``)."""
    if name not in LOSSES:
        raise ValueError(f"unknown config.loss {name!r}; one of {', '.join(map(repr, LOSSES))}")
    return LOSSES[name]


@nnx.jit(static_argnames=("l2",))
def cll_step(model, optimizer: nnx.Optimizer, batch, l2: float = 0.0):
    """One optimizer step on :func:`cll_loss`, in place: ``(loss, aux)`` before the update.

    ``aux`` is :func:`cll_loss`'s plus ``grad_norm`` (the global norm of the gradient). The
    loop of a hand-written training run (the trainer, :mod:`foldax.train.train`, adds sharding,
    checkpoints and evaluation)::

        optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
        for batch in batches:
            loss, aux = cll_step(model, optimizer, batch)
    """
    (loss, aux), grads = nnx.value_and_grad(cll_loss, has_aux=True)(model, batch, l2)
    optimizer.update(model, grads)
    return loss, dict(aux, grad_norm=optax.global_norm(grads))
