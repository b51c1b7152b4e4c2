"""The ``foldax`` command.

Subcommands::

    foldax fold [SEQ|FILE ...] [-i FILE|-] [--params P | --model NAME] [--mea [--gamma G]] [-p] [-T C]
                [--format dbn|bpseq|ct] [-o PREFIX] [--plot] [--skip-invalid] ...
    foldax plot --workdir W [-o OUT.png]
    foldax train ... / foldax eval ... / foldax export-params ...   (see train.main)
    foldax familyfold --config C --workdir W ...                      (see train.familyfold)

``foldax fold`` folds with the parameters of ``--params`` and prints, for each record,
what RNAfold prints::

    >id
    SEQUENCE
    STRUCTURE ( -4.50)

The default parameters (:data:`foldax.parameters.DEFAULT`, ``turner2004+turner1999+stacking``) are
a mixture: the structure is the MEA structure (gamma 1) of ``0.35 P_turner2004 + 0.35 P_turner1999 +
0.3 P_stacking`` (pair probabilities of Turner 2004, Turner 1999 and the stacking model trained on
ArchiveII), the most accurate model on ArchiveII family-fold (BENCHMARKS.md), and its value and
``-p``'s lines are Turner 2004's. With ``--noLP`` (energy parameters only) the default is
``turner2004+turner1999`` (:data:`foldax.parameters.DEFAULT_ENERGY`). ``--params turner2004`` prints
exactly what RNAfold prints: its minimum free energy structure and numbers.

For energy parameters (Turner) the value is the structure's free energy in kcal/mol
and ``-p`` adds RNAfold's three lines: the pseudo-bracket summary of the pair
probabilities with the ensemble free energy ``[ -4.87]``, the centroid structure
``{ -4.50 d=2.98}``, and `` frequency of mfe structure in ensemble 0.545923; ensemble
diversity 3.53``. For a stacking model the value is the structure's *score* (a
natural-log weight, higher is better, never called an energy), and ``-p`` adds the
pseudo-brackets with ``[log Z = ...]`` and the structure's frequency with the ensemble
diversity. ``--format bpseq|ct`` prints those formats instead (score and log Z in
the header/comments; a CT header says ``score = S``, and ``ENERGY = E`` only for an
energy model). Output files with ``-o PREFIX`` (PREFIX may be a directory:
``out/``), one set per record, named from the record id (characters other than
``A-Za-z0-9._+-`` become ``_``; a repeated id gets ``_2``...):

* ``PREFIX<id>.<dbn|bpseq|ct>``: what was printed for the record (in .dbn files the
  ``-p`` lines start with ``# ``, so every file reads back with ``foldax.data.formats``);
* ``PREFIX<id>_bpp.txt`` (with ``-p``): two ``#`` header lines, then ``i j p`` lines,
  1-based, ``i < j``, ``p >= --bpp-cutoff``;
* ``PREFIX<id>_samples.txt`` (with ``--sample S``): two ``#`` lines, ``>id``, the sequence, then the S
  sampled structures' lines as printed (``structure value probability``, as ``RNAsubopt -p S
  --stochBT_en``: :func:`foldax.fold.sample_lines`);
* ``PREFIX<id>_dp.png`` and ``PREFIX<id>_arc.png`` (with ``--plot``; without ``-o``
  they go to the current directory, and stderr says so): the dot plot (upper
  triangle: pair probabilities, square-root shading; lower triangle: the predicted
  structure -- the decoder is named in the title -- and the reference, if the input
  had one) and the arc diagram.

``--params`` takes a shipped parameter set or mixture by name (``turner2004``, ``stacking``,
``handset``, ``turner2004+turner1999+stacking``: :mod:`foldax.parameters`; ``--model NAME`` is the same),
``A+B`` (a uniform mixture, folded by MEA), a parameter file
(``.par``, ``.json``, ``.npz``) or a training workdir: then the workdir's best checkpoint
(``--checkpoint latest``: its latest) is restored as the whole model -- a neural model
folds with its ``phi`` network -- and stderr says which checkpoint it was (a
``params.npz`` in the workdir is not used). stderr always names the parameters used
and where they came from.

Speed: the first use of a batch shape compiles a program (seconds for the stacking
model, tens of seconds for the Turner model today), which is kept in
``~/.cache/foldax/programs`` (:mod:`foldax.programs`; ``FOLDAX_CACHE_DIR`` elsewhere,
empty for none): later calls load it. Sequences are folded in batches by length
bucket, split over one CPU device per core (``JAX_NUM_CPU_DEVICES`` chooses another
count), with a progress bar when stderr is a terminal.

Exit status: 0 on success; 1 for bad input (every bad record is reported, naming
its id, ``file:line`` and the position of the bad character) or bad parameters;
2 for a usage error. With ``--skip-invalid`` bad records are reported on stderr and
skipped, and the status is 0 when at least one record was folded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import secrets
import sys

from foldax.parameters import DEFAULT as DEFAULT_PARAMS  # no JAX: that starts after the command line is read
from foldax.parameters import DEFAULT_ENERGY

FORWARDED = ("train", "eval", "export-params")
#: Records folded (and kept in memory) at a time: fewer when each keeps its [n, n] pair probabilities.
BLOCK, BLOCK_WITH_PROBS = 8192, 512
#: With --sample, at most this many samples (records x S) are kept at a time.
SAMPLES_PER_BLOCK = 1 << 16


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


def _seed(text):
    value = int(text)
    if not 0 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^32), got {value}")
    return value


def _celsius(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= -273.15:
        raise argparse.ArgumentTypeError(f"must be a temperature in degrees Celsius above -273.15, got {text}")
    return value


def _pos_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


SUBCOMMANDS = {
    "fold": "predict secondary structures (and pair probabilities, dot plots) for sequences",
    "plot": "plot the training curves (loss, validation F1) of a training workdir",
    "train": "train (or resume) a model in a workdir from a config",
    "eval": "metrics of a training workdir's best (or latest) checkpoint on a split",
    "export-params": "write a training workdir's score tensors to an .npz (for --params)",
}

MAIN_EPILOG = """\
examples:
  foldax fold GGGGAAACCCC                                   structure and free energy (default model)
  foldax fold GGGGAAACCCC --params turner2004               RNAfold's MFE structure and energy
  foldax fold -i seqs.fa -p                                 ... with RNAfold -p's ensemble lines
  foldax fold -i seqs.fa -p --mea --gamma 2 -o out/ --plot  MEA structures, bpp files, dot plots
  foldax fold -i seqs.fa --sample 100 --seed 1              100 structures from each ensemble (RNAsubopt -p)
  foldax train --config default --workdir runs/default      train on ArchiveII (tRNA held out)
  foldax train --config tiny --workdir runs/tiny --config.num_train_steps=60 --config.batch_size=16
  foldax eval --workdir runs/default                        test metrics of the best checkpoint
  foldax fold -i seqs.fa --params runs/default              fold with the trained model

train and eval take any config field as --config.a.b=VALUE (e.g. --config.optimizer.learning_rate=0.01,
--config.data.train_files=mine.dbn); 'foldax COMMAND --help' tells more.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foldax", description="Fold RNAs with the foldax inside algorithm, plot, and train its scores.",
        epilog=MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    fold = sub.add_parser(
        "fold", help=SUBCOMMANDS["fold"],
        description="Predict secondary structures. Input: sequences or files as arguments, -i FILE, or "
                    "stdin (FASTA, plain one-per-line, or dot-bracket with reference structures; "
                    ".bpseq/.ct/.tsv files by extension).",
        epilog="Output, as RNAfold's: '>id', the sequence, 'structure (value)' per record -- the free energy in "
               "kcal/mol for energy parameters (Turner 2004's for the default mixture), the model's log-score for a stacking "
               "model (higher is better, not a free energy); with -p the ensemble line ('[ensemble free energy]' "
               "or '[log Z = ...]'), the centroid (energy models) and the structure's frequency. See "
               "'foldax/cli.py' for the files written with -o and --plot. Exit status: 0 ok, 1 bad input or "
               "parameters, 2 usage.")
    fold.add_argument("inputs", nargs="*", metavar="SEQ|FILE",
                      help="sequences to fold, or files to read (an existing path is read as a file; an argument "
                           "with '/' or '.' is always a path)")
    fold.add_argument("-i", "--input", metavar="FILE", help="read records from FILE ('-' = stdin)")
    fold.add_argument("--params", metavar="NAME|FILE|WORKDIR",
                      help="the parameters: a shipped set by name (turner2004: Turner 2004 free energies, RNAfold's; "
                           "stacking: the stacking model trained on ArchiveII; handset: hand-set stacking scores; "
                           "turner1999, andronescu2007, langdon2018: ViennaRNA's other energy sets), a "
                           "file (.par ViennaRNA parameter file, .json Turner tables, .npz from 'foldax "
                           "export-params'), a training workdir (its best checkpoint, the whole model), or "
                           "A+B: a mixture of sets or files, folded by MEA from their mean pair "
                           f"probabilities; default: {DEFAULT_PARAMS}, the MEA structure of Turner 2004's, "
                           "Turner 1999's and the trained stacking model's weighted pair probabilities (the most "
                           "accurate on ArchiveII family-fold, see BENCHMARKS.md; with --noLP "
                           f"{DEFAULT_ENERGY}; --params turner2004 prints RNAfold's MFE). stderr says which "
                           "parameters were used and where they came from")
    fold.add_argument("--model", metavar="NAME", help="the same as --params NAME (a shipped parameter set)")
    fold.add_argument("--checkpoint", choices=("best", "latest"), default=None,
                      help="with --params WORKDIR: the best checkpoint by the validation metric (default) or "
                           "the latest")
    fold.add_argument("--mea", action="store_true",
                      help="print the maximum expected accuracy structure (from pair probabilities) "
                           "instead of the best-scoring one (a mixture, the default too, always does)")
    fold.add_argument("--gamma", type=_pos_float, default=None,
                      help="MEA pair weight (needs --mea or a mixture; default: the parameters' own: 1 for "
                           "the default mixture, 0.5 for turner2004 and turner2004+turner1999, "
                           "a training run's config.gamma, else 1.0)")
    fold.add_argument("-p", "--partition", action="store_true",
                      help="also compute log Z and base-pair probabilities (ensemble line; _bpp.txt with -o)")
    fold.add_argument("--min-hairpin", type=_nonneg_int, default=None, metavar="N",
                      help="a pair (i, j) needs j - i > N (default: the model's, 3)")
    fold.add_argument("-T", "--temperature", type=_celsius, default=37.0, metavar="CELSIUS",
                      help="fold at this temperature, as RNAfold -T (default 37): energy parameters only, "
                           "rescaled from their enthalpies as ViennaRNA does (a .par file's own, Turner 2004's "
                           f"for other energy files); without --params the default is {DEFAULT_ENERGY}, the "
                           "default without its stacking member. -p's numbers are ViennaRNA's with pf_smooth = 0 "
                           "(RNAfold's default smooths dangle energies near 0, which away from 37 C can move "
                           "the ensemble free energy by a few 0.01 kcal/mol)")
    fold.add_argument("-d", "--dangles", type=int, choices=(0, 2), default=2,
                      help="RNAfold -d: 2 (default) scores the neighbours of every stem in multiloops and the "
                           "exterior loop (mismatch or dangle energies); 0 scores none (-d0). Energy parameters "
                           "only; RNAfold's -d1 and -d3 (coaxial stacking) are not supported")
    fold.add_argument("--noLP", dest="no_lonely_pairs", action="store_true",
                      help="no lonely pairs (helices of one pair), as RNAfold --noLP; energy parameters only. "
                           "The MFE structure is RNAfold's; so are -p's numbers: RNAfold's ensemble only drops "
                           "the pairs that can only occur isolated (see --noLP-exact). --mea and the centroid "
                           "decode the pair probabilities and may hold lonely pairs, as RNAfold's do")
    fold.add_argument("--noLP-exact", dest="no_lp_exact", action="store_true",
                      help="--noLP, and -p's ensemble is exactly the structures without lonely pairs (its "
                           "ensemble free energy is higher than RNAfold's -p --noLP)")
    fold.add_argument("-C", "--constraint", action="store_true",
                      help="hard constraints, as RNAfold -C: in FASTA-like input the line after each sequence "
                           "is its constraint (instead of a reference structure): '.' none, 'x' unpaired, "
                           "'<' / '>' paired with a later / earlier base or unpaired, '( )' paired together or "
                           "unpaired, with no pair crossing them. '|' (must pair) has no effect without "
                           "--enforceConstraint, as in RNAfold, and stderr says so. A '( )' of bases that cannot "
                           "pair (AU GC GU) is an error. Records without a constraint line fold unconstrained")
    fold.add_argument("--enforceConstraint", dest="enforce_constraint", action="store_true",
                      help="with -C, as RNAfold: each '( )' pair must form and each '|' base must pair "
                           "('<' '>' unchanged); the MFE, -p's numbers and pair probabilities are those of "
                           "the enforced ensemble. stderr warns about a record whose structure misses some")
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
    fold.add_argument("--sample", "--stochBT", dest="samples", type=_pos_int, default=0, metavar="S",
                      help="also print S structures drawn from each record's Boltzmann ensemble (exact stochastic "
                           "traceback, as RNAsubopt -p S --stochBT_en): one line each after the record's lines, "
                           "'structure value probability' -- its free energy (kcal/mol) or, for a stacking model, "
                           "its score, and its probability in the ensemble (with -C the constrained one; the default "
                           "mixture's: each sample drawn from one member by its weight). With -o also "
                           "PREFIX<id>_samples.txt. Dot-bracket output only")
    fold.add_argument("--seed", type=_seed, default=None, metavar="N",
                      help="with --sample: the random seed (default: a fresh one, named on stderr so that the "
                           "samples can be drawn again)")

    plot = sub.add_parser("plot", help=SUBCOMMANDS["plot"])
    plot.add_argument("--workdir", required=True, help="training workdir (TensorBoard event files / metrics.jsonl)")
    plot.add_argument("-o", "--output", metavar="PNG", help="output file (default WORKDIR/training_curves.png)")
    plot.add_argument("--loss-tags", nargs="+", metavar="TAG",
                      help="tags for the loss panel (default: tags named loss, */loss, *_loss)")
    plot.add_argument("--f1-tags", nargs="+", metavar="TAG",
                      help="tags for the F1 panel (default: tags named f1, */f1, *_f1)")

    for name in FORWARDED:
        fwd = sub.add_parser(name, help=f"{SUBCOMMANDS[name]} (see 'foldax {name} --help')", add_help=False)
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
    """The ``foldax`` console entry point; returns the exit status.

    When it starts JAX itself (JAX not imported yet: the ``foldax`` command, not a test
    calling this function), ``foldax fold`` also sets JAX up for the process: one CPU
    device per core (:func:`foldax.layers.devices.default_cpu_devices`) and the program cache
    (:mod:`foldax.programs`). Run as the command (``argv`` None), it first re-executes itself
    with glibc's huge-page tunable where that helps (:mod:`foldax.hugepages`).
    """
    own_process = "jax" not in sys.modules
    if argv is None and own_process:
        from foldax import hugepages

        hugepages.reexec_with_huge_pages()  # XLA's buffers on huge pages: 1.1x faster (foldax/hugepages.py)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        import importlib

        train_main = importlib.import_module("foldax.train.main")  # lazily: training pulls in a lot
        try:
            rc = train_main.main(argv)
        except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and stops by itself)
            print(f"foldax {argv[0]}: interrupted (Ctrl-C); checkpoints written so far are kept", file=sys.stderr)
            return 130
        return 0 if rc is None else int(rc)
    if argv and argv[0] == "familyfold":
        from foldax.train.familyfold import main as familyfold_main  # lazily, as above

        return familyfold_main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as err:
        return _exit_code(err)
    if args.command == "fold":
        if args.model is not None:
            if args.params is not None:
                print("foldax fold: error: give --params or --model, not both", file=sys.stderr)
                return 2
            args.params = args.model
        from foldax.parameters import is_mixture

        args.mea = args.mea or is_mixture(args.params)  # a mixture (the default too) folds by MEA only
        if args.gamma is not None and not args.mea:
            print("foldax fold: error: --gamma needs --mea (or a mixture of parameter sets, which folds by MEA: "
                  "the default parameters)", file=sys.stderr)
            return 2
        if args.checkpoint is not None and not (args.params and os.path.isdir(args.params)):
            print("foldax fold: error: --checkpoint needs --params WORKDIR (a training workdir)", file=sys.stderr)
            return 2
        return run_fold(args, own_process=own_process)
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


def _program_cache(own_process: bool):
    """The :class:`foldax.programs.FoldPrograms` of this run. When the process is ours, JAX is set up
    first (before its first computation): one CPU device per core, and the cache of compiled
    programs (:func:`foldax.programs.cache_dir`)."""
    from foldax import programs

    directory = None
    if own_process:
        from foldax.layers import devices

        devices.default_cpu_devices()
        directory = programs.cache_dir()
    notice = None
    if sys.stderr.isatty():
        def notice(shape):  # the first use of a program takes a while: say why
            kept = "kept for next time" if directory else "not kept: no cache directory"
            _err(f"compiling the program for batches of {shape[0]} x {shape[1]} nt (first use; {kept})")
    return programs.FoldPrograms(directory, notice=notice)


class _NoBar:
    """What :func:`_progress_bar` gives when there is no terminal (tqdm is not even imported)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    clear = refresh = update


def _progress_bar(total: int):
    """A tqdm bar on stderr when stderr is a terminal (never in pipes and logs)."""
    if not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="seq", desc="foldax fold", leave=False, file=sys.stderr, dynamic_ncols=True)


def run_fold(args, *, own_process: bool = False) -> int:
    import jax

    from foldax import fold as F

    if args.enforce_constraint and not args.constraint:
        _err("error: --enforceConstraint needs -C (the constraints it enforces)")
        return 2
    if args.samples and args.format != "dbn":
        _err(f"error: --sample prints dot-bracket lines (as RNAsubopt -p); it cannot go with --format {args.format}")
        return 2
    if args.seed is not None and not args.samples:
        _err("error: --seed needs --sample (nothing else is random)")
        return 2
    items = F.read_inputs(args.inputs, args.input, constraints=args.constraint)
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
    from foldax.layers.constraints import must_pair_positions

    ignored = {} if args.enforce_constraint else {r.id: must_pair_positions(r.constraint) for r in records
                                                   if r.constraint}
    ignored = {rid: positions for rid, positions in ignored.items() if positions}
    if ignored:
        shown = "; ".join(f"{rid}: {', '.join(str(p + 1) for p in positions)}" for rid, positions in
                          list(ignored.items())[:4]) + (f"; and {len(ignored) - 4} more records" if len(ignored) > 4
                                                        else "")
        _err(f"note: '|' (must pair) has no effect, as in RNAfold -C without --enforceConstraint (positions, "
             f"1-based: {shown})")
    from foldax.layers.compiled import high_water
    from foldax.layers.inside import is_energy_params

    try:
        high_water()  # a bad FOLDAX_MAPPINGS_HIGH_WATER fails here, not after the first program
    except ValueError as err:
        _err(f"error: {err}")
        return 2
    programs = _program_cache(own_process)
    no_lonely_pairs = args.no_lonely_pairs or args.no_lp_exact
    spec = args.params
    hot = args.temperature != 37.0
    energy_options = [name for name, given in (("--noLP", no_lonely_pairs), (f"-T {args.temperature:g}", hot),
                                               ("-d0", args.dangles == 0)) if given]
    if spec is None and energy_options:  # the default's stacking member has none of them
        spec = DEFAULT_ENERGY
        _err(f"{' and '.join(energy_options)} need{'s' if len(energy_options) == 1 else ''} energy parameters: "
             f"folding with {DEFAULT_ENERGY}, the default without its stacking member")
    try:
        model = F.load_model(spec, checkpoint=args.checkpoint or "best", temperature=args.temperature)
    except (OSError, ValueError) as err:
        _err(f"error: {err}")
        return 1
    for note in model.notes:
        _err(note)
    if hot:
        _err(f"temperature: {args.temperature:g} C (energies rescaled from their enthalpies as ViennaRNA does; "
             f"kT = {model.energy_kT:.6f} kcal/mol)")
    all_energy = all(is_energy_params(p) for p in (model.params, *model.members))
    if no_lonely_pairs and not all_energy:
        _err("error: --noLP needs energy parameters (e.g. --params turner2004); the stacking grammar (here "
             f"{model.description}) has no such option")
        return 2
    if args.dangles == 0:
        if not all_energy:
            _err("error: -d0 needs energy parameters (e.g. --params turner2004); the stacking grammar (here "
                 f"{model.description}) has no dangles")
            return 2
        from foldax.layers.energy_params import without_dangles

        model = dataclasses.replace(model, params=without_dangles(model.params),
                                    members=tuple(without_dangles(p) for p in model.members))
        _err("dangles: 0 (RNAfold -d0: no mismatch or dangle energies for stems in multiloops and the exterior loop)")

    stems = F.output_names(r.id for r in records)
    want_probs = args.partition or args.plot
    gamma = model.mea_gamma if args.gamma is None else args.gamma
    decoder = decoder_name(model, mea=args.mea, gamma=gamma)
    block_size = BLOCK_WITH_PROBS if want_probs else BLOCK
    seed = args.seed
    if args.samples:  # each record keeps its samples until its block is printed
        block_size = max(1, min(block_size, SAMPLES_PER_BLOCK // args.samples))
        if seed is None:
            seed = secrets.randbits(32)
            _err(f"samples: seed {seed} (--seed {seed} draws the same samples again)")
    plotted = []
    with _progress_bar(len(records)) as bar:
        for start in range(0, len(records), block_size):
            block = records[start:start + block_size]
            results = F.fold_records(model, block, mea=args.mea, gamma=gamma, partition=args.partition,
                                     probs=want_probs, min_hairpin=args.min_hairpin,
                                     no_lonely_pairs=no_lonely_pairs,
                                     no_lp_ensemble="exact" if args.no_lp_exact else "rnafold",
                                     batch_size=args.batch_size, enforce_constraints=args.enforce_constraint,
                                     programs=programs, progress=bar.update, samples=args.samples,
                                     key=None if seed is None else jax.random.fold_in(jax.random.key(seed), start))
            if args.enforce_constraint:
                _report_unmet(results)
            bar.clear()  # the bar and the printed results share the terminal
            plotted += _write_results(args, results, stems[start:start + block_size], decoder,
                                      several=len(records) > 1)
            bar.refresh()
    if plotted and args.prefix is None:
        shown = ", ".join(plotted[:4]) + (f" and {len(plotted) - 4} more" if len(plotted) > 4 else "")
        _err(f"--plot without -o: wrote {len(plotted)} PNG file(s) to the current directory {os.getcwd()}: "
             f"{shown} (use -o DIR/ to choose where)")
    return 0


def _report_unmet(results) -> None:
    """stderr names each record whose structure misses enforced elements of its constraint (they
    cannot all be met; an MEA structure may also leave a '|' base unpaired)."""
    from foldax.layers.constraints import enforced_bonus

    for result in results:
        constraint = result.record.constraint
        if constraint and enforced_bonus(constraint, result.structure) < enforced_bonus(constraint):
            _err(f"warning: {result.record.id}: the structure meets "
                 f"{enforced_bonus(constraint, result.structure) / enforced_bonus(constraint):.0%} of the "
                 f"constraint's enforced pairs and '|' bases (they cannot all be met, or an MEA structure "
                 f"leaves some unpaired)")


def _write_results(args, results, stems, decoder: str, *, several: bool) -> list[str]:
    """Prints (and with -o writes) a block of results; returns the PNG files written."""
    from foldax import fold as F

    plotted = []
    for result, stem in zip(results, stems):
        sys.stdout.write(F.format_result(result, args.format))
        sys.stdout.write("".join(f"{line}\n" for line in F.sample_lines(result)))
        if args.format == "bpseq" and several:
            sys.stdout.write("\n")
        base = _base_path(args.prefix, stem)
        if args.prefix is not None:
            _write(f"{base}.{args.format}", F.format_result(result, args.format, comments=True))
            if args.partition:
                _write(f"{base}_bpp.txt", F.bpp_text(result, args.bpp_cutoff))
            if result.samples is not None:
                _write(f"{base}_samples.txt", F.samples_text(result))
        if args.plot:
            plotted.extend(_plot_result(result, base, decoder))
    sys.stdout.flush()
    return plotted


def decoder_name(model, *, mea: bool, gamma: float) -> str:
    """How the printed structure was chosen, for plot titles: ``MEA structure (gamma 2)``,
    ``minimum free energy structure`` (an energy model) or ``best-scoring structure``."""
    if mea:
        return f"MEA structure (gamma {gamma:g})"
    return "minimum free energy structure" if model.energy_kT is not None else "best-scoring structure"


def _plot_result(result, base: str, decoder: str) -> list[str]:
    from foldax import plots

    rec = result.record
    title = f"{rec.id}: {decoder}" + (" vs reference" if rec.reference is not None else "")
    paths = [f"{base}_dp.png", f"{base}_arc.png"]
    plots.dot_plot(result.probs, result.structure, rec.reference, rec.sequence, path=paths[0], title=title,
                   structure_label=decoder)
    plots.arc_diagram(result.structure, rec.reference, rec.sequence, path=paths[1], title=title)
    return paths


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
