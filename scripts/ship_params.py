"""Writes a trained run's parameters into the package as a shipped parameter set, with provenance.

    .venv/bin/python scripts/ship_params.py --workdir runs/stacking_all --file stacking.npz \
        --recipe "configs/default.py, data.fold='' (ArchiveII random split)" --familyfold runs/ff/familyfold.json

The file goes to ``layers/data/FILE`` (a name in ``layers/data/registry.json``). Its provenance is what
``foldax export-params`` records (workdir, checkpoint, step, validation metrics, model / data / optimizer
config, foldax commit) plus the recipe, the run's held-out test metrics (``summary.json``, if it evaluated
a test split) and, with
``--familyfold``, the family-fold means of the same recipe (each family held out in turn; the
validation split never holds the held-out family), so that a user can see what to expect on RNA families
the parameters never saw.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--file", required=True, help="file name in layers/data/ (.npz or .json)")
    parser.add_argument("--recipe", required=True, help="the config and overrides the run used, in words")
    parser.add_argument("--familyfold", default=None, help="familyfold.json of the same recipe")
    args = parser.parse_args(argv)

    from foldax import layers
    from foldax.train.train import export_params

    with tempfile.TemporaryDirectory() as tmp:
        exported = export_params(args.workdir, os.path.join(tmp, args.file))
        params, provenance = layers.load_params(exported), layers.read_provenance(exported)
    with open(os.path.join(args.workdir, "summary.json")) as fh:
        summary = json.load(fh)
    provenance["recipe"] = args.recipe
    test = {k[len("test/"):]: v for k, v in summary.items() if k.startswith("test/")}
    if test:  # a run with eval_test = False has none
        provenance["test_metrics"] = test | {"n_seqs": summary.get("data/test")}
    if args.familyfold:
        with open(args.familyfold) as fh:
            ff = json.load(fh)
        provenance["familyfold"] = {
            "complete": ff.get("complete"), "families_missing": ff.get("families_missing"),
            "mean_over_families": {m: {k: v for k, v in row.items() if k != "label"} | {"label": row["label"]}
                                   for m, row in ff["mean"].items()},
            "per_family_f1": {f: {m: r["f1"] for m, r in row["methods"].items()}
                              for f, row in ff.get("families", {}).items()},
        }
    out = ROOT / "layers" / "data" / args.file
    layers.save_params(params, out, provenance=provenance)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
