"""What a trained ``phi`` encoder adds to the Turner model: the mean ``phi`` over candidate pairs.

    .venv/bin/python benchmarks/encoder_phi.py runs/ff_turner_neural/5s --which latest --families tRNA,5s,srp

For the first ``--rows`` filtered ArchiveII rows of each family, it runs the checkpoint's encoder
(``model.encoder``). It then prints the mean and standard deviation of ``phi[i, j]`` (log-weight units;
``-kT phi`` in kcal/mol) over every canonical pair (AU GC GU, ``j - i > 3``) and over the reference
pairs alone. A mean well below 0 on both is a general penalty on pairing rather than a pattern that
tells true pairs from others. BENCHMARKS.md ("The neural row") uses it.
"""

import argparse

import jax.numpy as jnp
import numpy as np
from flax import nnx

from foldax import layers
from foldax.data.archiveii import load_archiveii
from foldax.layers.energy_params import PAIR_INDEX
from foldax.train.train import restore_for_inference


def phi_stats(encoder, examples) -> dict:
    """Mean and sd of ``phi`` over the canonical pairs and the reference pairs of ``examples``."""
    canonical, reference = [], []
    for ex in examples:
        seq = ex["sequence"].upper().replace("T", "U")
        tokens, lengths = layers.encode_batch([seq])
        phi = np.asarray(encoder(jnp.asarray(tokens), jnp.asarray(lengths)))[0]
        x = np.asarray(tokens)[0, : len(seq)]
        i, j = np.nonzero((PAIR_INDEX[x[:, None], x[None, :]] >= 0)
                          & (np.arange(len(seq))[None, :] - np.arange(len(seq))[:, None] > 3))
        canonical.append(phi[i, j])
        reference.append(phi[i, j][np.asarray(ex["pair_table"])[i] == j])
    canonical, reference = np.concatenate(canonical), np.concatenate(reference)
    return {"canonical": (float(canonical.mean()), float(canonical.std())),
            "reference": (float(reference.mean()), float(reference.std()))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", help="a training workdir of a model with a phi encoder")
    parser.add_argument("--which", default="best", choices=("best", "latest"))
    parser.add_argument("--families", default="tRNA,5s,srp")
    parser.add_argument("--rows", type=int, default=20, help="rows per family")
    args = parser.parse_args(argv)
    _, _, manager, graphdef, state, step = restore_for_inference(args.workdir, args.which)
    manager.close()
    model = nnx.merge(graphdef, state)[0]
    if not hasattr(model, "encoder"):
        raise SystemExit(f"{args.workdir}: model has no phi encoder")
    examples = load_archiveii(None, filtered=True)
    for family in args.families.split(","):
        rows = [ex for ex in examples if ex["family"] == family][: args.rows]
        stats = phi_stats(model.encoder, rows)
        print(f"step {step} {family}: phi over canonical pairs {stats['canonical'][0]:+.3f} "
              f"(sd {stats['canonical'][1]:.3f}), over reference pairs {stats['reference'][0]:+.3f} "
              f"(sd {stats['reference'][1]:.3f})")


if __name__ == "__main__":
    main()
