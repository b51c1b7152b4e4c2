"""Checks a family-fold evaluation of the unmodified Turner 2004 model against RNAfold, structure by structure.

    .venv/bin/python benchmarks/familyfold_ties.py runs/ff/5s/familyfold_family.json

For every sequence where foldax's best structure (``layers.best_structure`` with ``turner2004()``) and
RNAfold's MFE structure score differently against the reference, both structures are evaluated with
ViennaRNA's ``eval_structure``: equal energies mean a tie between co-optimal structures, anything else
a bug somewhere in the chain (data, decoding, energies). Only meaningful for a family evaluated at
step 0 (Turner 2004 itself), e.g. a family whose validation picked the starting point.
"""

import json
import sys

import numpy as np
import RNA

from foldax import layers
from foldax.data.archiveii import load_archiveii


def main(path):
    result = json.load(open(path))
    differing = sorted(x["id"] for x in result["sequences"] if abs(x["f1"]["best"] - x["f1"]["rnafold"]) > 1e-9)
    by_id = {ex["id"]: ex for ex in load_archiveii(None)}
    seqs = [by_id[i]["sequence"].upper().replace("T", "U") for i in differing]
    params, gaps = layers.turner2004(), []
    for start in range(0, len(seqs), 64):
        chunk = seqs[start:start + 64]
        tokens, lengths = layers.encode_batch(chunk)
        best = np.asarray(layers.best_structure(params, tokens, lengths))
        for k, seq in enumerate(chunk):
            fc = RNA.fold_compound(seq)
            _, mfe = fc.mfe()
            gaps.append(fc.eval_structure(layers.to_dot_bracket(best[k][: len(seq)])) - mfe)
    gaps = np.asarray(gaps)
    print(f"{path}: step {result['step']}; {len(result['sequences'])} sequences, {len(differing)} score differently "
          f"from RNAfold; energy of foldax's structure - RNAfold's MFE: max {gaps.max() if len(gaps) else 0:.4f} "
          f"kcal/mol, {int((np.abs(gaps) > 1e-6).sum())} not ties")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        main(arg)
