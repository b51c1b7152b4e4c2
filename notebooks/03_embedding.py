# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The inside layer inside larger models (Flax NNX and Linen)
#
# `layers.InsideLayer` is an `nnx.Module` that owns the four score tensors and returns
# $\log Z(x)$; any network can feed it extra pair potentials $\phi_{ij}$ (`phi`,
# `[B, L, L]`), and gradients flow through the dynamic program into that network.
# `layers.LinenInsideLayer` is the same layer for Linen models
# (`flax.nnx.bridge.to_linen`). The same layer holds the Turner 2004 energy tables
# instead with `layers.InsideLayer(params="turner2004")` (every table an `nnx.Param`,
# kcal/mol; `phi` then adds to the log-weight $-E/kT$), which is what
# `foldax.model.models.TurnerModel` and `configs/turner.py` train; here we stay with the
# stacking scores, whose DP compiles in seconds.
#
# We build a small "sequence -> phi -> inside" model three ways and train each for a
# few optax steps with the conditional log-likelihood
# $-\log p(s \mid x) = \log Z(x) - \mathrm{score}(x, s)$:
#
# 1. a hand-written NNX model with `InsideLayer`,
# 2. the same in Linen with `LinenInsideLayer`,
# 3. the library's ready-made `foldax.model.models.NeuralPhiModel` with `foldax.model.loss.cll_loss`
#    (what `train/` trains with `configs/neural.py`).
#
# Data: random sequences whose structures are sampled exactly from a known "teacher"
# (`layers.default_params()`), so the teacher's own NLL is a reference point.
# Runs in well under a minute on a CPU.

# %%
# %matplotlib inline
import pathlib
import sys

_root = next((p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents] if (p / "layers" / "chart.py").exists()), None)
if _root is not None and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foldax import layers

STEPS = 25
MIN_HAIRPIN = 3
NUM_CHUNKS = 1  # static diagonal chunks of the DP: at L = 48 one compiles fastest

# %% [markdown]
# ## Data: sequences with teacher-sampled structures

# %%
rng = np.random.default_rng(0)
seqs = ["".join(rng.choice(list("ACGU"), n)) for n in rng.integers(30, 49, size=16)]
tokens, lengths = layers.encode_batch(seqs, buckets=(48,))
teacher = layers.default_params()
pair_table = layers.sample_structures(jax.random.key(0), teacher, tokens, 1, lengths)[:, 0]  # [B, L]
batch = {"tokens": jnp.asarray(tokens), "lengths": jnp.asarray(lengths), "pair_table": pair_table,
         "weights": jnp.ones(len(seqs), jnp.float32)}
n_nt = float(lengths.sum())
teacher_nll = float(-layers.log_prob(teacher, tokens, pair_table, lengths).sum() / n_nt)
print(tokens.shape, "e.g.", seqs[0])
print("     ", layers.to_dot_bracket(np.asarray(pair_table[0])[: lengths[0]]))
print(f"teacher NLL per nt: {teacher_nll:.3f}")


# %% [markdown]
# ## 1. NNX: a pair network feeding `InsideLayer`
#
# An embedding and a 1D convolution give per-position features $h_i$; a bilinear head
# gives $\phi_{ij} = \langle A h_i, B h_j \rangle$. `InsideLayer.log_prob` is
# `structure_score - log Z` with the layer's own tensors and the given `phi`.

# %%
class PairNet(nnx.Module):
    def __init__(self, *, features=16, rngs: nnx.Rngs):
        self.embed = nnx.Embed(5, features, rngs=rngs)
        self.conv = nnx.Conv(features, features, kernel_size=(5,), padding="SAME", rngs=rngs)
        self.left = nnx.Linear(features, features, rngs=rngs)
        self.right = nnx.Linear(features, features, kernel_init=nnx.initializers.zeros, rngs=rngs)  # phi = 0 at init
        self.inside = layers.InsideLayer(rngs=rngs, min_hairpin=MIN_HAIRPIN, num_chunks=NUM_CHUNKS)

    def phi(self, tokens):
        h = self.embed(tokens)
        h = h + jax.nn.gelu(self.conv(h))
        return jnp.einsum("bif,bjf->bij", self.left(h), self.right(h)) / h.shape[-1]

    def __call__(self, tokens, lengths, pair_table):
        """Per-sequence log p(s | x)."""
        return self.inside.log_prob(tokens, pair_table, lengths, phi=self.phi(tokens))


def nnx_loss(model, batch):
    return -model(batch["tokens"], batch["lengths"], batch["pair_table"]).sum() / n_nt


@nnx.jit
def nnx_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(nnx_loss)(model, batch)
    optimizer.update(model, grads)
    return loss


model = PairNet(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
nnx_losses = [float(nnx_step(model, optimizer, batch)) for _ in range(STEPS)]
print(f"NNX   : NLL/nt {nnx_losses[0]:.3f} -> {nnx_losses[-1]:.3f}")
print("trained tensors:", {k: v.shape for k, v in model.inside.params_dict().items()})


# %% [markdown]
# ## 2. Linen: the same model with `LinenInsideLayer`
#
# The layer's tensors live in the `params` collection under its `name`; methods of the
# NNX layer (`structure_score`, `max_score`, `log_prob`) are callable on the Linen
# form too.

# %%
class LinenPairNet(nn.Module):
    features: int = 16

    @nn.compact
    def __call__(self, tokens, lengths, pair_table):
        h = nn.Embed(5, self.features)(tokens)
        h = h + jax.nn.gelu(nn.Conv(self.features, (5,), padding="SAME")(h))
        left = nn.Dense(self.features, name="left")(h)
        right = nn.Dense(self.features, kernel_init=nn.initializers.zeros, name="right")(h)
        phi = jnp.einsum("bif,bjf->bij", left, right) / self.features
        inside = layers.LinenInsideLayer(min_hairpin=MIN_HAIRPIN, num_chunks=NUM_CHUNKS, name="inside")
        return inside.log_prob(tokens, pair_table, lengths, phi=phi)


linen_model = LinenPairNet()
variables = linen_model.init(jax.random.key(0), batch["tokens"], batch["lengths"], batch["pair_table"])
print("params:", list(variables["params"]), "| inside:", {k: v.shape for k, v in variables["params"]["inside"].items()})

tx = optax.adam(0.05)
opt_state = tx.init(variables["params"])


@jax.jit
def linen_step(params, opt_state, batch):
    def loss_fn(params):
        log_p = linen_model.apply({"params": params}, batch["tokens"], batch["lengths"], batch["pair_table"])
        return -log_p.sum() / n_nt

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


params = variables["params"]
linen_losses = []
for _ in range(STEPS):
    params, opt_state, loss = linen_step(params, opt_state, batch)
    linen_losses.append(float(loss))
print(f"Linen : NLL/nt {linen_losses[0]:.3f} -> {linen_losses[-1]:.3f}")

# %% [markdown]
# ## 3. The ready-made `NeuralPhiModel`
#
# `model/` packages this pattern: `NeuralPhiModel` (embedding, residual convolutions
# masked to each sequence's length, bilinear pair head starting at `phi = 0`) exposes
# `scores(tokens, lengths) -> (params, phi)`, and `foldax.model.loss.cll_loss(model, batch)`
# is the per-nucleotide CLL loss the trainer uses (with `weights` for padding rows);
# `foldax.model.loss.cll_step(model, optimizer, batch)` is one jitted optimizer step on it.

# %%
from foldax.model.loss import cll_step
from foldax.model.models import NeuralPhiModel

neural = NeuralPhiModel(rngs=nnx.Rngs(0), features=16, kernel_size=5, num_layers=1, pair_features=16,
                        min_hairpin=MIN_HAIRPIN, num_chunks=NUM_CHUNKS)
neural_opt = nnx.Optimizer(neural, optax.adam(0.05), wrt=nnx.Param)
neural_losses = [float(cll_step(neural, neural_opt, batch)[0]) for _ in range(STEPS)]
print(f"Neural: NLL/nt {neural_losses[0]:.3f} -> {neural_losses[-1]:.3f}")

# %% [markdown]
# ## Training curves
#
# All three start as the same kind of model (random tensors, `phi = 0`) and fit the
# 16 training structures; with this little data they overfit towards (and past) the
# teacher's NLL, which only shows that gradients flow through the whole stack.

# %%
fig = Figure(figsize=(6, 3.8))
FigureCanvasAgg(fig)
ax = fig.add_subplot()
for name, losses in (("NNX PairNet", nnx_losses), ("Linen PairNet", linen_losses), ("NeuralPhiModel", neural_losses)):
    ax.plot(np.arange(1, STEPS + 1), losses, marker="o", markersize=3, label=name)
ax.axhline(teacher_nll, color="0.4", linestyle="--", linewidth=1, label="teacher")
ax.set_xlabel("step")
ax.set_ylabel("NLL per nucleotide")
ax.grid(alpha=0.3)
ax.legend()
fig
