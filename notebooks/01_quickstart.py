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
# # foldax quickstart
#
# foldax computes the RNA *inside algorithm* -- the log partition function
# $\log Z(x) = \log \sum_s e^{\mathrm{score}(x, s)}$ over all nested secondary
# structures $s$ of a sequence $x$ -- exactly, fast and differentiably in JAX.
# Everything else in this notebook (base-pair probabilities, the best and the
# MEA structure, expected counts of each stacking type) is that one function and
# its gradient.
#
# Runs top to bottom on a CPU in well under a minute (the time is mostly XLA
# compilation). Source of truth: `notebooks/01_quickstart.py` (jupytext percent
# format); see `notebooks/README.md` for how to open or render it.

# %%
# %matplotlib inline
import pathlib
import sys

# Make the repository importable when foldax is not pip-installed (-e .) and the
# notebook runs from notebooks/ or the repository root.
_root = next((p for p in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents] if (p / "layers" / "chart.py").exists()), None)
if _root is not None and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from foldax import layers
from foldax import plots

print("jax", jax.__version__, "on", jax.devices()[0].platform)

# %% [markdown]
# ## 1. Encode a sequence
#
# Our example is yeast tRNA-Phe (76 nt) with its known cloverleaf structure
# (from ArchiveII, `tRNA_tdbR00000083`). Tokens are `A=0 C=1 G=2 U=3 N=4`;
# `T` reads as `U`, IUPAC ambiguity codes read as `N`.

# %%
SEQUENCE = "GCGGAUUUAGCUCAGUUGGGAGAGCGCCAGACUGAAGAUCUGGAGGUCCUGUGUUCGAUCCACAGAAUUCGCACCA"
REFERENCE = "(((((((..((((........)))).(((((.......))))).....(((((.......))))))))))))...."

tokens = layers.encode(SEQUENCE)
reference = layers.from_dot_bracket(REFERENCE)  # pair table: partner index or -1
print(len(SEQUENCE), "nt; first tokens:", tokens[:12].tolist())
print("reference pairs:", int((reference >= 0).sum() // 2))

# Several sequences at once: padded to a bucket length, with their true lengths.
batch_tokens, batch_lengths = layers.encode_batch([SEQUENCE, "GGGGAAACCCC", "ACGUACGUAGCU"])
print("batch:", batch_tokens.shape, "lengths", batch_lengths.tolist())

# %% [markdown]
# ## 2. Score parameters
#
# The grammar has four score tensors (log-space, higher is better):
#
# | tensor | shape | score of |
# | --- | --- | --- |
# | `stack` | `[5, 5, 5, 5]` | pair (i, j) stacked on (i+1, j-1): `stack[x_i, x_j, x_{j-1}, x_{i+1}]` |
# | `pair` | `[5, 5]` | every pair (i, j): `pair[x_i, x_j]` |
# | `unpaired` | `[5]` | every unpaired base |
# | `loop` | `[]` | a pair closing a loop (not stacked) |
#
# `layers.default_params()` is a small hand-set, physically flavoured set (canonical
# pairs, G-C stacks strongest); `layers.init_params(key)` gives random ones to train
# (see `02_training.py`).

# %%
params = layers.default_params()
{name: value.shape for name, value in params.items()}

# %% [markdown]
# ## 3. The log partition function
#
# `layers.log_partition` takes one sequence (`[n]` -> scalar) or a padded batch
# (`[B, L]` + `lengths` -> `[B]`); padding never changes a result. `layers.max_score`
# is the same dynamic program in the max semiring: the best structure's score.

# %%
log_z = layers.log_partition(params, tokens)
best_score = layers.max_score(params, tokens)
print(f"log Z = {float(log_z):.3f}   max score = {float(best_score):.3f}")
print("batched log Z:", np.round(np.asarray(layers.log_partition(params, batch_tokens, batch_lengths)), 3))

# %% [markdown]
# ## 4. Base-pair probabilities and a dot plot
#
# $P_{ij} = p((i,j) \in s \mid x)$. Adding a potential $\phi_{ij}$ to the score of
# pair (i, j) shows that $P = \partial \log Z / \partial \phi$: `layers.pair_probs` is one
# inside and one outside pass (`jax.grad` runs the outside algorithm, `layers/chart.py`).

# %%
probs = np.asarray(layers.pair_probs(params, tokens))
print("symmetric:", np.allclose(probs, probs.T), "  max row sum (p(i paired)) =", probs.sum(1).max().round(3))
print(f"expected number of pairs: {probs.sum() / 2:.2f}")

# %% [markdown]
# ## 5. Best and MEA structures
#
# * `layers.best_structure`: $\arg\max_s \mathrm{score}(s)$ -- the gradient of `max_score`
#   w.r.t. $\phi$ is the 0/1 indicator of its pairs.
# * `layers.mea_structure`: maximum expected accuracy from the pair probabilities
#   (larger `gamma` -> more pairs).
#
# Both return pair tables; `layers.to_dot_bracket` turns them into strings.

# %%
best = np.asarray(layers.best_structure(params, tokens))


def f1(pred, ref):
    """Base-pair F1 of two pair tables."""
    p = {(i, j) for i, j in enumerate(pred) if j > i}
    r = {(i, j) for i, j in enumerate(ref) if j > i}
    tp = len(p & r)
    return 2 * tp / max(len(p) + len(r), 1)


print(SEQUENCE)
print(REFERENCE, " reference")
print(layers.to_dot_bracket(best), f" best          (F1 {f1(best, reference):.2f})")
for gamma in (1.0, 2.0, 4.0, 8.0):  # gamma is traced: no recompilation per value
    table = np.asarray(layers.mea_structure(probs, gamma=gamma))
    print(layers.to_dot_bracket(table), f" MEA gamma={gamma:<3} (F1 {f1(table, reference):.2f})")
mea = np.asarray(layers.mea_structure(probs, gamma=8.0))
# The best structure's score is max_score, and its probability is e^(score - log Z).
print(f"p(best structure) = {float(jnp.exp(layers.log_prob(params, tokens, best))):.4f}")

# %% [markdown]
# With these parameters the best structure is the cloverleaf; MEA needs a larger
# `gamma` to commit to the weaker arms. The dot plot: pair probabilities above the
# diagonal, the MEA structure (`gamma=8`) against the reference below it (green: in
# both; blue: predicted only; red: reference only).

# %%
plots.dot_plot(probs, structure=mea, reference=reference, sequence=SEQUENCE,
               title="tRNA-Phe, default parameters: P(i, j); MEA (gamma 8) vs reference")

# %% [markdown]
# Exact samples from the Boltzmann distribution $p(s \mid x) = e^{\mathrm{score}(s)}/Z$
# (a stochastic traceback through the same charts):

# %%
for table in layers.sample_structures(jax.random.key(0), params, tokens, 3):
    print(layers.to_dot_bracket(table))

# %% [markdown]
# ## 6. Gradients: expected counts of each stacking type
#
# $\log Z$ is differentiable in every score tensor. Since each stacked pair of type
# $(x_i, x_j, x_{j-1}, x_{i+1})$ adds `stack[...]` to the score,
# $\partial \log Z / \partial\, \mathrm{stack}[a, b, c, d]$ is the *expected number*
# of such stacks under $p(s \mid x)$ -- likewise `pair` gives expected pair counts
# (their sum is the expected number of pairs, $\sum_{i<j} P_{ij}$).

# %%
grads = jax.grad(layers.log_partition)(params, tokens)
print(f"sum of d logZ/d pair : {float(grads['pair'].sum()):.3f}  = sum_(i<j) P_ij = {probs.sum() / 2:.3f}")
print(f"sum of d logZ/d stack: {float(grads['stack'].sum()):.3f}  expected stacked pairs")

# %% [markdown]
# As a heat map: rows are the outer pair $(x_i, x_j)$, columns the inner pair
# $(x_{i+1}, x_{j-1})$ read 5'->3' (the tensor stores it as `[x_{j-1}, x_{i+1}]`, so
# we swap the last two axes before reshaping `[5, 5, 5, 5] -> [25, 25]`).

# %%
g_stack = np.asarray(grads["stack"]).transpose(0, 1, 3, 2).reshape(25, 25)
labels = [a + b for a in layers.ALPHABET for b in layers.ALPHABET]

fig = Figure(figsize=(7.5, 6.5))
FigureCanvasAgg(fig)
ax = fig.add_subplot()
image = ax.imshow(g_stack, cmap="viridis")
ax.set_xticks(range(25), labels, rotation=90, fontfamily="monospace", fontsize=7)
ax.set_yticks(range(25), labels, fontfamily="monospace", fontsize=7)
ax.set_xlabel("inner pair $x_{i+1} x_{j-1}$")
ax.set_ylabel("outer pair $x_i x_j$")
ax.set_title("d log Z / d stack: expected number of each stack in tRNA-Phe")
fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="expected count")
fig

# %%
top = np.argsort(g_stack.ravel())[::-1][:5]
for k in top:
    r, c = divmod(int(k), 25)
    print(f"outer {labels[r]} on inner {labels[c]}: {g_stack[r, c]:.2f} expected")
