"""Where the Turner grammar's time goes: each part of the recursion replaced in turn by a stand-in.

``--part`` runs `pair_probs` (or ``--function best_structure``; float32, random ACGU) with one part
of the diagonal step replaced by a stand-in of the same shape that does no work, so that the
difference to ``whole`` is that part's cost. The stand-ins give wrong values: the numbers are
timings only. One part per process (the patch is global)::

    for part in whole interior qmm both; do
        taskset -c 0 .venv/bin/python benchmarks/turner_profile.py --part $part --length 500 --batch 1
    done
    taskset -c 0 .venv/bin/python benchmarks/turner_profile.py --part whole --function best_structure
    taskset -c 0 .venv/bin/python benchmarks/turner_profile.py --elementwise
    taskset -c 0 .venv/bin/python benchmarks/turner_profile.py --compile-phases --length 200 [--chunks 1]

* ``interior``: the interior-loop length sums (``layers/turner.py``: ``_loop_sums``, and
  ``_linear_loop_rows`` with ``_sum_linear_rows`` in the log semiring) return their window's first row;
* ``qmm``: the multiloop split sum reads one split row instead of all;
* ``both``: the two together (what is left is everything else).

``--compile-phases [--chunks K]``: the trace, lowering and XLA compile times of ``pair_probs``
(``XLA_FLAGS`` applies, e.g. ``--xla_backend_optimization_level=0``).

``--elementwise``: XLA's speed per element of ``exp``, ``log``, ``+ 1`` and a 27-row ``logsumexp``
on a [32, 31, 2610] float32 array, beside NumPy's ``exp``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def _stand_ins(part: str) -> None:
    import jax.numpy as jnp

    from foldax.layers import turner

    if part in ("interior", "both"):
        def first_row(sr, lengths_table, qb, inner, linear, first_shift, width):
            rows = lengths_table.shape[1]
            return jnp.broadcast_to(qb[:, :1, :width] + inner[:, :1, :width], (qb.shape[0], rows, width))

        def first_row_linear(lengths_table, inner, linear, first_shift, width):
            window = linear[0][:, :1, :width] * inner[:, :1, :width]
            shape = (window.shape[0], lengths_table.shape[1], width)
            return jnp.broadcast_to(window, shape), jnp.zeros(shape, window.dtype)

        turner._loop_sums = first_row
        turner._linear_loop_rows = first_row_linear  # the log semiring's form of the same sums
        turner._sum_linear_rows = lambda rows: rows[0][0][:, 0] + rows[0][1][:, 0]
    if part in ("qmm", "both"):
        views = turner.TurnerGrammar.views

        def one_split_row(self, d, rows, width, length):
            v = views(self, d, rows, width, length)
            return {**v, "qm_left": dataclasses.replace(v["qm_left"], rows=1),
                    "qm1_right": dataclasses.replace(v["qm1_right"], rows=1)}

        turner.TurnerGrammar.views = one_split_row


def _best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def part_timing(part: str, length: int, batch: int, repeats: int, function: str = "pair_probs") -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from foldax import layers

    _stand_ins(part)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), layers.turner2004())
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 4, (batch, length)), jnp.int32)
    # best_structure: the max semiring's outside pass, beside its forward pass (max_score).
    forward_name = "log_partition" if function == "pair_probs" else "max_score"
    outside, forward = getattr(layers, function), jax.jit(getattr(layers, forward_name))
    t = time.perf_counter()
    outside(params, tokens).block_until_ready()
    first = time.perf_counter() - t
    forward(params, tokens).block_until_ready()
    pp = _best_of(lambda: outside(params, tokens).block_until_ready(), repeats)
    fw = _best_of(lambda: forward(params, tokens).block_until_ready(), repeats)
    print(f"{part:9s} n={length} batch={batch}: {function} {pp * 1e3:8.1f} ms ({pp * 1e3 / batch:.1f} ms/seq), "
          f"{forward_name} {fw * 1e3:7.1f} ms, first call {first:.0f} s", flush=True)


def elementwise(repeats: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.asarray(np.random.default_rng(0).random((32, 31, 2610)), jnp.float32)
    ops = {"exp": jnp.exp, "log": jnp.log, "+ 1": lambda v: v + 1.0,
           "logsumexp of 27 rows": lambda v: jax.nn.logsumexp(v[:, :27], axis=1)}
    for name, op in ops.items():
        f = jax.jit(op)
        f(x).block_until_ready()
        t = _best_of(lambda: f(x).block_until_ready(), repeats)
        print(f"XLA {name:22s} {t / x.size * 1e9:.3f} ns per element", flush=True)
    host = np.asarray(x)
    t = _best_of(lambda: np.exp(host), repeats)
    print(f"NumPy exp                  {t / x.size * 1e9:.3f} ns per element")


def compile_phases(length: int, batch: int, num_chunks) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from foldax import layers
    from foldax.layers import decoding

    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), layers.turner2004())
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 4, (batch, length)), jnp.int32)
    lengths = jnp.full((batch,), length, jnp.int32)
    t0 = time.perf_counter()
    traced = decoding._pair_probs.trace(params, tokens, lengths, None, min_hairpin=3, num_chunks=num_chunks)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    lowered.compile()
    t3 = time.perf_counter()
    print(f"pair_probs n={length} batch={batch} chunks={num_chunks or 'auto'}: trace {t1 - t0:.1f} s, "
          f"lower {t2 - t1:.1f} s, compile {t3 - t2:.1f} s", flush=True)


def main(argv=None) -> int:
    if argv is None:
        from foldax import hugepages

        hugepages.reexec_with_huge_pages()  # as the foldax command does (FOLDAX_HUGE_PAGES=0: without)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["whole", "interior", "qmm", "both"], default="whole")
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--function", choices=["pair_probs", "best_structure"], default="pair_probs",
                    help="what --part times (best_structure: the max semiring's outside pass)")
    ap.add_argument("--elementwise", action="store_true", help="the elementwise speeds instead")
    ap.add_argument("--compile-phases", action="store_true",
                    help="trace, lower and compile times of pair_probs instead (--chunks: 0 = automatic)")
    ap.add_argument("--chunks", type=int, default=0)
    args = ap.parse_args(argv)
    if args.elementwise:
        elementwise(max(args.repeats, 20))
    elif args.compile_phases:
        compile_phases(args.length, args.batch, args.chunks or None)
    else:
        part_timing(args.part, args.length, args.batch, args.repeats, args.function)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
