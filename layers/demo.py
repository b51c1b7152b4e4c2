"""The built-in default job: score a few example RNAs with the default parameters.

Run ``python -m foldax.layers.demo [SEQ ...]``: prints each sequence's length, log Z
(log-sum over all structures) and the best structure's score, computed as one
padded batch.
"""

from __future__ import annotations

import sys
import time

from foldax import layers

EXAMPLES = {
    "hairpin": "GGGGAAACCCC",
    "tRNA-Phe (yeast)": "GCGGAUUUAGCUCAGUUGGGAGAGCGCCAGACUGAAGAUCUGGAGGUCCUGUGUUCGAUCCACAGAAUUCGCACCA",
    "5S rRNA fragment": "GCCUACGGCCAUACCACCCUGAAAGCACCGGUUCUCGUCUGAUCACCGAAGCCAAGCAGGGUCGGGCCUGGUUAGUACUUGG",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = {f"seq{k}": s for k, s in enumerate(argv)} if argv else EXAMPLES
    params = layers.default_params()
    tokens, lengths = layers.encode_batch(list(named.values()))
    start = time.perf_counter()
    log_z = layers.log_partition(params, tokens, lengths)
    best = layers.max_score(params, tokens, lengths)
    elapsed = time.perf_counter() - start
    print(f"{'name':<20} {'length':>6} {'log Z':>10} {'best score':>11}")
    for name, n, lz, b in zip(named, lengths.tolist(), log_z.tolist(), best.tolist()):
        print(f"{name:<20} {n:>6} {lz:>10.4f} {b:>11.4f}")
    print(f"(batch of {len(named)} padded to L={tokens.shape[1]}; {elapsed:.1f} s including compilation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
