"""The ``foldax`` command.

Subcommands::

    foldax fold [SEQ|FILE ...] [-i FILE|-] [--params P] [--mea [--gamma G]] [-p]
                [--format dbn|bpseq|ct] [-o PREFIX] [--plot] [--skip-invalid] ...
    foldax plot --workdir W [-o OUT.png]
    foldax train ... / foldax eval ... / foldax export-params ...   (see train.main)
    foldax familyfold --config C --workdir W ...                      (see train.familyfold)

``foldax fold`` prints, for each record (RNAfold style)::

    >id
    SEQUENCE
    STRUCTURE (score)

``score`` is the model score of the structure (higher is better; it is not a free
energy). With ``-p`` two more lines follow: RNAfold's pseudo-bracket summary of the
pair probabilities with ``[log Z]``, and the structure's probability in the
ensemble with the ensemble diversity. ``--format bpseq|ct`` prints those formats
instead (score and log Z in the header/comments). Output files with ``-o PREFIX``
(PREFIX may be a directory: ``out/``), one set per record, named from the record id
(characters other than ``A-Za-z0-9._+-`` become ``_``; a repeated id gets ``_2``...):

* ``PREFIX<id>.<dbn|bpseq|ct>``: what was printed for the record (in .dbn files the
  two ``-p`` lines start with ``# ``, so every file reads back with ``data.formats``);
* ``PREFIX<id>_bpp.txt`` (with ``-p``): ``i j p`` lines, 1-based, ``i < j``, ``p >= --bpp-cutoff``;
* ``PREFIX<id>_dp.png`` and ``PREFIX<id>_arc.png`` (with ``--plot``; without ``-o``
  they go to the current directory): the dot plot (upper triangle: pair
  probabilities; lower triangle: the predicted structure and the reference, if the
  input had one) and the arc diagram.

Exit status: 0 on success; 1 for bad input (every bad record is reported, naming
its id, ``file:line`` and the position of the bad character) or bad parameters;
2 for a usage error. With ``--skip-invalid`` bad records are reported on stderr and
skipped, and the status is 0 when at least one record was folded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

FORWARDED = ("train", "eval", "export-params")
BLOCK = 512  # records folded (and kept in memory) at a time


def _nonneg_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _pos_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _pos_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foldax", description="Fold RNAs with the foldax inside algorithm, plot, and train its scores.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    fold = sub.add_parser(
        "fold", help="predict secondary structures (and pair probabilities) for sequences",
        description="Predict secondary structures. Input: sequences or files as arguments, -i FILE, or "
                    "stdin (FASTA, plain one-per-line, or dot-bracket with reference structures; "
                    ".bpseq/.ct/.tsv files by extension).",
        epilog="Output: '>id', the sequence, 'structure (score)' per record (score: model score, higher is "
               "better); see 'foldax/cli.py' for the files written with -o and --plot. Exit status: 0 ok, "
               "1 bad input or parameters, 2 usage.")
    fold.add_argument("inputs", nargs="*", metavar="SEQ|FILE",
                      help="sequences to fold, or files to read (an existing path is read as a file)")
    fold.add_argument("-i", "--input", metavar="FILE", help="read records from FILE ('-' = stdin)")
    fold.add_argument("--params", metavar="NPZ|WORKDIR",
                      help="trained scores: an .npz from 'foldax export-params' or a training workdir "
                           "(default: layers.default_params(), the built-in hand-set scores)")
    fold.add_argument("--mea", action="store_true",
                      help="print the maximum expected accuracy structure (from pair probabilities) "
                           "instead of the best-scoring one")
    fold.add_argument("--gamma", type=_pos_float, default=None, help="MEA pair weight (default 1.0; needs --mea)")
    fold.add_argument("-p", "--partition", action="store_true",
                      help="also compute log Z and base-pair probabilities (ensemble line; _bpp.txt with -o)")
    fold.add_argument("--min-hairpin", type=_nonneg_int, default=3, metavar="N",
                      help="a pair (i, j) needs j - i > N (default 3)")
    fold.add_argument("--format", choices=("dbn", "bpseq", "ct"), default="dbn", help="output format (default dbn)")
    fold.add_argument("-o", "--prefix", metavar="PREFIX",
                      help="also write one file per record: PREFIX<id>.<format> (PREFIX may be a directory 'dir/')")
    fold.add_argument("--plot", action="store_true",
                      help="write PREFIX<id>_dp.png (dot plot) and PREFIX<id>_arc.png (arc diagram)")
    fold.add_argument("--bpp-cutoff", type=float, default=1e-5, metavar="P",
                      help="smallest probability written to _bpp.txt (default 1e-5)")
    fold.add_argument("--skip-invalid", action="store_true",
                      help="report invalid records on stderr and fold the others")
    fold.add_argument("--batch-size", type=_pos_int, default=None, metavar="B",
                      help="at most B sequences per batched call (default: by length, at most 64)")

    plot = sub.add_parser("plot", help="plot training curves (loss, validation F1) of a training workdir")
    plot.add_argument("--workdir", required=True, help="training workdir (TensorBoard event files / metrics.jsonl)")
    plot.add_argument("-o", "--output", metavar="PNG", help="output file (default WORKDIR/training_curves.png)")
    plot.add_argument("--loss-tags", nargs="+", metavar="TAG", help="tags for the loss panel (default: tags named loss, */loss, *_loss)")
    plot.add_argument("--f1-tags", nargs="+", metavar="TAG", help="tags for the F1 panel (default: tags named f1, */f1, *_f1)")

    for name in FORWARDED:
        fwd = sub.add_parser(name, help=f"{name} (see 'foldax {name} --help')", add_help=False)
        fwd.add_argument("rest", nargs=argparse.REMAINDER)
    ff = sub.add_parser("familyfold", add_help=False,
                        help="train one model per held-out ArchiveII family, compare with RNAfold "
                             "(see 'foldax familyfold --help')")
    ff.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _exit_code(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 2


def main(argv: list[str] | None = None) -> int:
    """The ``foldax`` console entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        import importlib

        train_main = importlib.import_module("train.main")  # lazily: training pulls in a lot
        rc = train_main.main(argv)
        return 0 if rc is None else int(rc)
    if argv and argv[0] == "familyfold":
        from train.familyfold import main as familyfold_main  # lazily, as above

        return familyfold_main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as err:
        return _exit_code(err)
    if args.command == "fold":
        if args.gamma is not None and not args.mea:
            print("foldax fold: error: --gamma needs --mea", file=sys.stderr)
            return 2
        return run_fold(args)
    if args.command == "plot":
        return run_plot(args)
    return 2  # pragma: no cover - argparse requires a command


# --------------------------------------------------------------------------- #
# fold
# --------------------------------------------------------------------------- #


def _err(message: str) -> None:
    print(f"foldax fold: {message}", file=sys.stderr)


def _base_path(prefix: str | None, stem: str) -> str:
    if prefix is None:
        return stem
    if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        return os.path.join(prefix, stem)
    return prefix + stem


def _write(path: str, text: str) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def run_fold(args) -> int:
    from foldax import fold as F

    items = F.read_inputs(args.inputs, args.input)
    errors = [it for it in items if isinstance(it, F.InputError)]
    records = [it for it in items if not isinstance(it, F.InputError)]
    for error in errors:
        _err(f"{'skipping invalid record' if args.skip_invalid else 'error'}: {error}")
    if errors and not args.skip_invalid:
        _err(f"{len(errors)} invalid record(s); nothing folded (use --skip-invalid to fold the others)")
        return 1
    if not records:
        _err("error: no sequences to fold" + (" (all records were invalid)" if errors else ""))
        return 1
    try:
        params = F.load_params(args.params)
    except (OSError, ValueError) as err:
        _err(f"error: {err}")
        return 1

    stems = F.output_names(r.id for r in records)
    want_probs = args.partition or args.plot
    gamma = 1.0 if args.gamma is None else args.gamma
    for start in range(0, len(records), BLOCK):
        block = records[start:start + BLOCK]
        results = F.fold_records(params, block, mea=args.mea, gamma=gamma, partition=args.partition,
                                 probs=want_probs, min_hairpin=args.min_hairpin, batch_size=args.batch_size)
        for result, stem in zip(results, stems[start:start + BLOCK]):
            text = F.format_result(result, args.format)
            sys.stdout.write(text)
            if args.format == "bpseq" and len(records) > 1:
                sys.stdout.write("\n")
            base = _base_path(args.prefix, stem)
            if args.prefix is not None:
                _write(f"{base}.{args.format}", F.format_result(result, args.format, comments=True))
                if args.partition:
                    _write(f"{base}_bpp.txt", F.bpp_lines(result.probs, args.bpp_cutoff))
            if args.plot:
                _plot_result(result, base)
        sys.stdout.flush()
    return 0


def _plot_result(result, base: str) -> None:
    from foldax import plots

    rec = result.record
    plots.dot_plot(result.probs, result.structure, rec.reference, rec.sequence, path=f"{base}_dp.png",
                   title=rec.id)
    plots.arc_diagram(result.structure, rec.reference, rec.sequence, path=f"{base}_arc.png", title=rec.id)


# --------------------------------------------------------------------------- #
# plot
# --------------------------------------------------------------------------- #


def _summary_title(workdir: str) -> str:
    title = os.path.basename(os.path.normpath(workdir))
    path = os.path.join(workdir, "summary.json")
    try:
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        return title
    if isinstance(summary, dict):
        items = [f"{k}={v:.4g}" for k, v in summary.items()
                 if "f1" in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool)]
        if items:
            title += "  (" + ", ".join(items[:4]) + ")"
    return title


def run_plot(args) -> int:
    from foldax import plots

    try:
        scalars = plots.read_scalars(args.workdir)
        out = args.output or os.path.join(args.workdir, "training_curves.png")
        plots.training_curves(scalars, out, loss_tags=args.loss_tags, f1_tags=args.f1_tags,
                              title=_summary_title(args.workdir))
    except (OSError, ValueError) as err:
        print(f"foldax plot: error: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
