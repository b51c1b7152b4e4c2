"""How far the Turner charts stray from a scale: can they be kept in linear space in float32? (issue 11)

ViennaRNA keeps its partition-function charts in linear space (double precision), each span scaled
by ``pf_scale ** width``, so that a loop sum is a multiply-add instead of a log-sum-exp. A float32
chart in linear space holds ~87 nats either side of its scale, and a split sum multiplies two
entries, so the entries must stay within about half of that. This prints, from foldax's exact
log-space charts (float32, ``turner2004``), how far ``QB`` (pairs) and ``QM`` (multiloop parts)
stray from two kinds of scale:

* *per width*: the spread (max - min over the finite cells) of one width's row -- the best any
  scale that depends only on the width (ViennaRNA's ``pf_scale ** width``) can do;
* *prefix potential*: ``chart[i][k] - (F5[k] - F5[i - 1])``, with ``F5`` the prefix log partition
  function. Any potential ``H[k + 1] - H[i]`` keeps the multiloop split sum consistent (the two
  factors' scales add up to the cell's); this one is only known after the fill.

    .venv/bin/python benchmarks/turner_scaling.py [--random 1000] [--families 16s,23s,grp2]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARCHIVEII = ROOT.parent / "shared" / "data" / "archiveii" / "archiveii.tsv"


def chart_offsets(sequence: str) -> dict:
    """For QB and QM: the worst per-width spread and the range of the deviation from the F5 potential (nats)."""
    import jax
    import jax.numpy as jnp

    from foldax import layers
    from foldax.layers import chart, inside, turner

    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), layers.turner2004())
    tokens = layers.encode(sequence)[None]
    n = tokens.shape[1]
    problem, inputs = inside.engine_inputs(params, tokens, jnp.array([n]), None, min_hairpin=3, num_chunks=4)
    charts = jax.jit(lambda x: chart.fill(problem, chart.LOG, x))(inputs)
    f5 = np.asarray(charts["F5"][0, 0, : n + 1])  # at t: the prefix of t bases
    by_width = {"QB": (np.asarray(charts["QBs"][0, turner.ROW_PAD:, :n]), 1),  # QB[i][i+w] at [w, i]
                "QM": (np.asarray(charts["QMc"][0, 1:, :n]), 0)}  # QM[i][i+m-1] at [m, i]
    out = {}
    for name, (cells, extra) in by_width.items():
        spread, low, high = 0.0, 0.0, 0.0
        for w in range(1, n):
            starts = np.arange(n - w + 1 - extra)
            values = cells[w, starts]
            finite = np.isfinite(values)
            if not finite.any():
                continue
            values = values[finite]
            deviation = values - (f5[starts + w + extra] - f5[starts])[finite]
            spread = max(spread, float(values.max() - values.min()))
            low, high = min(low, float(deviation.min())), max(high, float(deviation.max()))
        out[name] = (spread, low, high)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", default="1000", help="lengths of random ACGU sequences (comma-separated)")
    parser.add_argument("--families", default="16s,23s,grp2", help="ArchiveII families: each one's longest sequence")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    sequences = {f"random {n} nt": "".join(rng.choice(list("ACGU"), int(n))) for n in args.random.split(",") if n}
    if args.families:
        rows = list(csv.DictReader(ARCHIVEII.open(), delimiter="\t"))
        for family in args.families.split(","):
            row = max((r for r in rows if r["family"] == family), key=lambda r: int(r["length"]))
            sequences[f"{row['id']} ({row['length']} nt)"] = row["sequence"]
    print("| sequence | QB: widest row spread | QB - F5 potential | QM: widest row spread | QM - F5 potential |")
    print("|---|---:|---:|---:|---:|")
    for name, sequence in sequences.items():
        o = chart_offsets(sequence)
        print(f"| {name} | {o['QB'][0]:.0f} | {o['QB'][1]:.0f} .. {o['QB'][2]:.0f} | {o['QM'][0]:.0f} | "
              f"{o['QM'][1]:.0f} .. {o['QM'][2]:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
