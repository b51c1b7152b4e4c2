"""Input-pipeline benchmark on ArchiveII: padding waste and batches per second.

Usage (from the repo root)::

    python -m benchmarks.pipeline_bench [--path ARCHIVEII] [--batch-size 32] [--epochs 3]

``--path`` is ``archiveii.tsv``, the raw ``.tar.gz`` or a folder of ``.ct``
files (default: the shared copy, ``../shared/data/archiveii/``). For several
configurations it prints, for one epoch: token waste (padded positions / all
positions), cubic waste (the same weighted by L^3: the share of an O(L^3)
DP's work spent on padding), padding rows, batches per epoch, and the
throughput of iterating the Grain pipeline (batches/s and examples/s,
including tokenisation and prefetching, no model).
"""

from __future__ import annotations

import argparse
import time

from foldax.data.archiveii import load_archiveii, recommended_filter
from foldax.layers.alphabet import DEFAULT_BUCKETS
from foldax.train.input_pipeline import InputPipeline, PipelineConfig, suggest_buckets


def measure(examples, config: PipelineConfig, epochs: int) -> dict:
    pipe = InputPipeline(examples, config)
    stats = pipe.padding_stats()
    iterator = iter(pipe)
    next(iterator)  # start the threads
    steps = epochs * pipe.steps_per_epoch - 1
    start = time.perf_counter()
    rows = 0
    for _ in range(steps):
        rows += int(next(iterator)["weights"].sum())
    elapsed = time.perf_counter() - start
    speed = {"batches_per_s": steps / elapsed, "examples_per_s": rows / elapsed}
    return {**stats, "examples": pipe.stats["n_used"], **speed}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    everything = load_archiveii(args.path)
    filtered = [ex for ex in everything if recommended_filter(ex)]
    tuned = suggest_buckets([ex["length"] for ex in filtered], 12, multiple_of=16, power=3)
    runs = [
        ("all 3975, default buckets", everything, DEFAULT_BUCKETS, False),
        ("all 3975, default buckets", everything, DEFAULT_BUCKETS, True),
        ("filtered (README), default buckets", filtered, DEFAULT_BUCKETS, False),
        ("filtered (README), default buckets", filtered, DEFAULT_BUCKETS, True),
        ("filtered, suggest_buckets(12, L^3)", filtered, tuned, False),
        ("filtered, suggest_buckets(12, L^3)", filtered, tuned, True),
    ]
    print(f"batch size {args.batch_size}, {args.epochs} epochs timed, {args.threads} threads")
    print(f"default buckets: {DEFAULT_BUCKETS}")
    print(f"suggest_buckets(filtered lengths, 12, multiple_of=16, power=3): {tuned}")
    header = f"{'data / buckets':<44} {'drop_rem':>8} {'n':>5} {'batches':>7} {'tok_waste':>9} {'L^3_waste':>9} " \
             f"{'pad_rows':>8} {'batch/s':>8} {'ex/s':>7}"
    print(header)
    print("-" * len(header))
    for name, examples, buckets, drop in runs:
        cfg = PipelineConfig(batch_size=args.batch_size, buckets=buckets, drop_remainder=drop, num_epochs=args.epochs,
                             shard_index=0, shard_count=1, num_threads=args.threads)
        r = measure(examples, cfg, args.epochs)
        print(f"{name[:44]:<44} {str(drop):>8} {r['examples']:>5} {r['num_batches']:>7} {r['token_waste']:>9.1%} "
              f"{r['cubic_waste']:>9.1%} {r['padding_rows']:>8.1%} {r['batches_per_s']:>8.0f} "
              f"{r['examples_per_s']:>7.0f}")


if __name__ == "__main__":
    main()
