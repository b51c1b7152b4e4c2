"""The Turner mixture with a trained stacking model mixed in: a nested family-fold screen on ArchiveII (issue 12).

The default model (``turner2004+turner1999``: MEA of the mean of two energy sets' pair probabilities) is
below RNAfold on tRNA, where the stacking model trained on the other families is above it. This screen
asks whether a weight ``w`` on a trained stacking model's pair probabilities,

    P = (1 - w) (P_turner2004 + P_turner1999) / 2 + w P_stacking,

decoded by MEA at ``gamma``, is better across families, with ``(w, gamma)`` chosen without the held-out
family:

* the held-out family ``F`` is scored with the stacking model trained without ``F``
  (``<models>/fold_F/params.npz``: ``configs/default.py`` at ``data.fold = F``, best checkpoint by the
  other families' validation rows);
* the candidate is the one with the best mean F1 over the other families ``G``, each scored with a
  stacking model trained without both ``F`` and ``G`` (``<models>/pair_F_G/params.npz``: ``data.fold = F``,
  ``data.valid_families = G``, latest checkpoint), so that neither ``F`` nor the family it is judged on
  was trained on. Families with no training rows (none up to ``data.max_length``, 200 nt) need no pair
  model: ``fold_G`` (or ``fold_F``) was trained without them anyway.

ViennaRNA computes the Turner pair probabilities (``familyfold_paramsets.vienna_ensemble``) and RNAfold's
structure, foldax the stacking ones (``layers.pair_probs``, float32) and the MEA structures
(``layers.mea_structure``, batched). Writes ``--out`` (JSON) after each family and resumes from it::

    bash benchmarks/train_nested_stacking.sh runs/nest          # the 24 stacking models, ~30 min
    .venv/bin/python benchmarks/familyfold_stacking_mixture.py --models runs/nest --out runs/nest/screen.json

(2026-12-06, ``--weights 0,0.1,0.2,0.3,0.5 --gammas 0.5,1``: 45 min, w 0.3 and gamma 1 chosen for every
family; BENCHMARKS.md, "A trained stacking model mixed in".) ``--fixed W,GAMMA`` evaluates one candidate
with each family's held-out model only (no choice, so no pair models), e.g. at full length::

    .venv/bin/python benchmarks/familyfold_stacking_mixture.py --models runs/nest --out runs/nest/full.json \
        --families 5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s,grp2 --max-length 3000 --fixed 0.3,1

(2026-12-06: 19 min; mean F1 0.573 over 10 families, against 0.567 at w 0 and RNAfold's 0.533.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from familyfold_gamma import best_on_others, family_examples, table_f1  # noqa: E402  (sibling benchmarks)
from familyfold_paramsets import load_energies, vienna_ensemble  # noqa: E402

FAMILIES = "5s,srp,tRNA,tmRNA,RNaseP,grp1,16s,telomerase,23s"
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
GAMMAS = (0.5, 1.0)
#: configs/default.py's data.max_length: longer rows are not trained on.
TRAIN_MAX_LENGTH = 200
BUCKETS = (64, 96, 128, 160, 200, 256, 384, 512, 768, 1024, 1536, 2048, 3072)


def key(w: float, gamma: float) -> str:
    return f"w{w:g}/mea{gamma:g}"


def score_key(model, w: float, gamma: float) -> str:
    """The per-family score's key of candidate ``(w, gamma)`` with stacking model ``model``; at w 0 the
    candidate is the two-way mixture, the same for every model.

      >>> score_key("m/fold_a/params.npz", 0.3, 1.0), score_key("m/fold_a/params.npz", 0.0, 0.5)
      ('m/fold_a/params.npz/w0.3/mea1', 'w0/mea0.5')
    """
    return key(w, gamma) if w == 0 else f"{model}/{key(w, gamma)}"


def model_without(models: Path, held_out: str, other: str | None, trained: set[str]) -> Path:
    """The stacking model trained without ``held_out`` and (if given) ``other``.

      >>> str(model_without(Path("m"), "tRNA", None, {"tRNA", "5s"}))
      'm/fold_tRNA/params.npz'
      >>> str(model_without(Path("m"), "tRNA", "5s", {"tRNA", "5s"}))
      'm/pair_5s_tRNA/params.npz'
      >>> str(model_without(Path("m"), "tRNA", "grp1", {"tRNA", "5s"}))  # grp1 is never trained on
      'm/fold_tRNA/params.npz'
      >>> str(model_without(Path("m"), "grp1", "5s", {"tRNA", "5s"}))
      'm/fold_5s/params.npz'
    """
    if other is None or other not in trained:
        return models / f"fold_{held_out}" / "params.npz"
    if held_out not in trained:
        return models / f"fold_{other}" / "params.npz"
    a, b = sorted((held_out, other))
    return models / f"pair_{a}_{b}" / "params.npz"


#: The shipped stacking file (configs/default.py on all of ArchiveII's rows up to TRAIN_MAX_LENGTH).
SHIPPED = "stacking"


def held_out_model(models: Path, family: str, trained: set[str]):
    """The stacking model that scores held-out ``family``: ``fold_<family>``, or, for a family with no
    training rows and no fold model (grp2: every sequence is longer than TRAIN_MAX_LENGTH), the shipped
    file, which never trained on it either.

      >>> held_out_model(Path("/nonexistent"), "grp2", {"tRNA"})
      'stacking'
      >>> str(held_out_model(Path("m"), "tRNA", {"tRNA"}))
      'm/fold_tRNA/params.npz'
    """
    path = model_without(models, family, None, trained)
    return SHIPPED if family not in trained and not path.exists() else path


def fixed_table(per_family: dict, families: list[str], fixed: tuple[float, float]) -> str:
    """Markdown: held-out F1 of the ``fixed`` (w, gamma) candidate beside the w 0, gamma 0.5 baseline and
    RNAfold, per family and as the mean.

      >>> row = lambda model, f1: {"n_seqs": 2, "models": {"held_out": model},
      ...                          "f1": {"rnafold": 0.5, "w0/mea0.5": 0.6, f"{model}/w0.3/mea1": f1}}
      >>> print(fixed_table({"a": row("m/fold_a/params.npz", 0.7), "b": row("stacking", 0.8)}, ["a", "b"], (0.3, 1.0)))
      | held-out family | seqs | stacking model | w 0.3, gamma 1 | w 0, gamma 0.5 | RNAfold |
      |---|---:|---|---:|---:|---:|
      | a | 2 | fold_a | 0.700 | 0.600 | 0.500 |
      | b | 2 | stacking | 0.800 | 0.600 | 0.500 |
      | **mean of 2** | | | **0.750** | **0.600** | **0.500** |
    """
    lines = [f"| held-out family | seqs | stacking model | w {fixed[0]:g}, gamma {fixed[1]:g} | w 0, gamma 0.5 | RNAfold |",
             "|---|---:|---|---:|---:|---:|"]
    columns = ([], [], [])
    for family in families:
        row = per_family[family]
        model = row["models"]["held_out"]
        values = (row["f1"][score_key(model, *fixed)], row["f1"][key(0.0, 0.5)], row["f1"]["rnafold"])
        for column, value in zip(columns, values):
            column.append(value)
        lines.append(f"| {family} | {row['n_seqs']} | {Path(model).parent.name or model} | "
                     + " | ".join(f"{v:.3f}" for v in values) + " |")
    means = [sum(c) / len(c) for c in columns]
    lines.append(f"| **mean of {len(families)}** | | | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    return "\n".join(lines)


def _batches(lengths):
    """``(bucket, indices)``: items of these lengths sharing a length bucket, at most ~2^20 chart cells
    per batch."""
    order = sorted(range(len(lengths)), key=lambda n: lengths[n])
    bucket_of = lambda n: next(b for b in BUCKETS if lengths[n] <= b)  # noqa: E731
    groups = {}
    for n in order:
        groups.setdefault(bucket_of(n), []).append(n)
    for bucket, members in groups.items():
        rows = max(1, (1 << 20) // (bucket * bucket))
        for start in range(0, len(members), rows):
            yield bucket, members[start:start + rows]


def _padded(part):
    """``part`` repeated up to a power of two, so that batch shapes (and compiles) repeat across families.

      >>> _padded([4, 7, 9])
      [4, 7, 9, 4]
    """
    size = 1 << (len(part) - 1).bit_length()
    return [part[n % len(part)] for n in range(size)]


def stacking_probs(path: Path, sequences: list[str]):
    """Symmetric float32 pair probabilities of each sequence under a stacking model file."""
    import jax.numpy as jnp
    import numpy as np

    from foldax import layers

    params = layers.load_params(str(path))
    out = [None] * len(sequences)
    for bucket, part in _batches([len(s) for s in sequences]):
        padded = _padded(part)
        tokens = np.zeros((len(padded), bucket), np.int32)
        for r, n in enumerate(padded):
            tokens[r, :len(sequences[n])] = np.asarray(layers.encode(sequences[n]))
        probs = np.asarray(layers.pair_probs(params, jnp.asarray(tokens), jnp.asarray([len(sequences[n]) for n in padded])))
        for r, n in enumerate(part):
            size = len(sequences[n])
            out[n] = probs[r, :size, :size].astype(np.float32)
    return out


def turner_probs(sequence: str):
    """The symmetric mean of Turner 2004's and Turner 1999's pair probabilities (ViennaRNA), and the
    MFE structure under Turner 2004 (RNAfold's)."""
    import numpy as np

    probs = []
    for name in ("turner2004", "turner1999"):
        load_energies(name)
        fc, structure, _ = vienna_ensemble(sequence)
        upper = np.triu(np.array(fc.bpp())[1:, 1:], 1)
        probs.append(upper + upper.T)
        if name == "turner2004":
            mfe = structure
    return ((probs[0] + probs[1]) / 2).astype(np.float32), mfe


def mea_f1(mixes, truths, gamma):
    """Per sequence, the F1 of foldax's MEA structure (:func:`foldax.layers.mea_structure`) of its
    pair probabilities ``mixes[n]``."""
    import jax.numpy as jnp
    import numpy as np

    from foldax import layers

    out = [None] * len(mixes)
    for bucket, part in _batches([len(m) for m in mixes]):
        padded = _padded(part)
        batch = np.zeros((len(padded), bucket, bucket), np.float32)
        for r, n in enumerate(padded):
            batch[r, :len(mixes[n]), :len(mixes[n])] = mixes[n]
        lengths = jnp.asarray([len(mixes[n]) for n in padded])
        tables = np.asarray(layers.mea_structure(jnp.asarray(batch), lengths, gamma=gamma))
        for r, n in enumerate(part):
            out[n] = table_f1(tables[r, :len(mixes[n])], truths[n])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="folder of fold_F/ and pair_F_G/ stacking workdirs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--families", default=FAMILIES)
    parser.add_argument("--weights", default=",".join(map(str, WEIGHTS)))
    parser.add_argument("--gammas", default=",".join(map(str, GAMMAS)))
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--fixed", default="", metavar="W,GAMMA",
                        help="evaluate only this candidate (and the w 0, gamma 0.5 baseline) with each family's "
                             "held-out model: no choice, so no pair models (e.g. at full length)")
    args = parser.parse_args(argv)
    import numpy as np

    from foldax.layers.dotbracket import from_dot_bracket

    models = Path(args.models)
    families = [f for f in args.families.split(",") if f]
    weights = [float(w) for w in args.weights.split(",")]
    gammas = [float(g) for g in args.gammas.split(",")]
    fixed = tuple(float(v) for v in args.fixed.split(",")) if args.fixed else None
    if fixed is not None:
        if len(fixed) != 2:
            parser.error(f"--fixed takes W,GAMMA, got {args.fixed!r}")
        weights, gammas = sorted({0.0, fixed[0]}), sorted({0.5, fixed[1]})
    if 0.0 not in weights or 0.5 not in gammas:
        parser.error("--weights must include 0 and --gammas 0.5: the shipped mixture (w 0, gamma 0.5) is the baseline")
    trained = {f for f in families if family_examples(f, TRAIN_MAX_LENGTH)}
    setup = {"families": families, "weights": weights, "gammas": gammas, "max_length": args.max_length,
             "fixed": list(fixed or ())}
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if done.get("setup") != setup:
        done = {"setup": setup, "per_family": {}}
    per_family = done["per_family"]
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        for family in families:
            if family in per_family:
                continue
            t0 = time.time()
            examples = family_examples(family, args.max_length)
            sequences = [ex["sequence"] for ex in examples]
            needed = {"held_out": held_out_model(models, family, trained)}
            if fixed is None:
                needed.update({f"without_{f}": model_without(models, f, family, trained) for f in families if f != family})
            missing = sorted({str(p) for p in needed.values() if str(p) != SHIPPED and not p.exists()})
            if missing:
                parser.error(f"missing stacking models: {', '.join(missing)} (see the module docstring)")
            paths = sorted(set(needed.values()), key=str)
            turner = pool.map(turner_probs, sequences, chunksize=4)
            truths = [np.asarray(ex["pair_table"]) for ex in examples]
            scores = {"rnafold": float(np.mean([table_f1(from_dot_bracket(mfe), t) for (_, mfe), t in zip(turner, truths)]))}
            for g in gammas:  # w = 0: the shipped two-way mixture, the same for every stacking model
                scores[score_key(None, 0.0, g)] = float(np.mean(mea_f1([p for p, _ in turner], truths, g)))
            for path in paths:
                stacking = stacking_probs(path, sequences)
                for w in weights:
                    if w == 0:
                        continue
                    mixes = [(1 - w) * t + w * st for (t, _), st in zip(turner, stacking)]
                    for g in gammas:
                        scores[score_key(path, w, g)] = float(np.mean(mea_f1(mixes, truths, g)))
            per_family[family] = {"n_seqs": len(sequences), "models": {k: str(v) for k, v in needed.items()}, "f1": scores}
            Path(args.out).write_text(json.dumps(done, indent=1))
            print(f"# {family}: {len(sequences)} sequences, {len(paths)} models, {time.time() - t0:.0f} s", flush=True)

    if fixed is not None:
        print(fixed_table(per_family, families, fixed))
        return 0

    def f1(family, held_out, candidate):
        """F1 on ``family`` of ``candidate`` with the stacking model trained without ``held_out`` (and it)."""
        row = per_family[family]
        model = row["models"]["held_out" if family == held_out else f"without_{held_out}"]
        return row["f1"][score_key(model, *candidate)]

    candidates = [(w, g) for w in weights for g in gammas]
    lines = ["| held-out family | seqs | chosen (w, gamma) on the others | its F1 | w = 0, gamma 0.5 | RNAfold |",
             "|---|---:|---|---:|---:|---:|"]
    chosen, base, rnafold = [], [], []
    for family in families:
        pick = best_on_others(candidates, lambda g, c: f1(g, family, c), families, family, tie=lambda c: -c[0])
        chosen.append(f1(family, family, pick))
        base.append(f1(family, family, (0.0, 0.5)))
        rnafold.append(per_family[family]["f1"]["rnafold"])
        lines.append(f"| {family} | {per_family[family]['n_seqs']} | w {pick[0]:g}, gamma {pick[1]:g} | {chosen[-1]:.3f} "
                     f"| {base[-1]:.3f} | {rnafold[-1]:.3f} |")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lines.append(f"| **mean of {len(families)}** | | | **{mean(chosen):.3f}** | {mean(base):.3f} | {mean(rnafold):.3f} |")
    lines += ["", "Held-out F1 of every candidate (each family scored with its fold model):", ""]
    for c in candidates:
        values = [f1(f, f, c) for f in families]
        lines.append(f"- w {c[0]:g}, gamma {c[1]:g}: mean {mean(values):.3f} ("
                     + ", ".join(f"{f} {v:.3f}" for f, v in zip(families, values)) + ")")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
