"""RNAfold's ``-p --noLP`` ensemble against foldax's exact one, on random sequences (float64).

    .venv/bin/python benchmarks/no_lp_ensembles.py --sizes 100,200,200,300

Per sequence: ViennaRNA's ensemble free energy with ``md.noLP = 1``; foldax's default grammar with
:func:`foldax.layers.isolated_pairs` forbidden through ``phi`` (RNAfold's ensemble: the free energy
and the largest difference of the pair probabilities to ``fc.bpp()``); foldax's exact ensemble
without lonely pairs (``no_lonely_pairs=True``) and how much higher its free energy is.
"""

from __future__ import annotations

import argparse
import random

import jax
import jax.numpy as jnp
import numpy as np

from foldax import layers


def vienna_no_lp(sequence):
    import RNA

    md = RNA.md()
    md.noLP, md.pf_smooth = 1, 0
    fc = RNA.fold_compound(sequence, md)
    _, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    _, ensemble = fc.pf()
    return ensemble, np.array(fc.bpp())[1:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[100, 200, 200, 300])
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)  # here, not at import: pytest imports this file for its doctests
    rng = random.Random(args.seed)
    params = layers.turner2004(jnp.float64)
    print(f"{'n':>5} {'RNAfold noLP':>13} {'fx isolated':>12} {'max |dP|':>9} {'fx exact':>10} {'exact - RNAfold':>16}")
    for n in args.sizes:
        seq = "".join(rng.choice("ACGU") for _ in range(n))
        x = layers.encode(seq)
        vienna, vienna_bpp = vienna_no_lp(seq)
        phi = jnp.where(layers.isolated_pairs(x), layers.FORBIDDEN_PHI, 0.0)
        compat = float(layers.ensemble_free_energy(params, x, phi=phi))
        probs = np.asarray(layers.pair_probs(params, x, phi=phi))
        exact = float(layers.ensemble_free_energy(params, x, no_lonely_pairs=True))
        print(f"{n:>5} {vienna:>13.4f} {compat:>12.4f} {np.abs(np.triu(probs, 1) - vienna_bpp).max():>9.1e} "
              f"{exact:>10.4f} {exact - vienna:>16.3f}", flush=True)


if __name__ == "__main__":
    main()
