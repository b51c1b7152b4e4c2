"""Command line of training: ``train``, ``eval`` and ``export-params``.

Usage (also as ``foldax train|eval|export-params ...``, which forwards here)::

    python -m foldax.train.main train --config configs/default.py --workdir runs/x [--config.batch_size=32 ...]
    python -m foldax.train.main eval --workdir runs/x [--split test] [--checkpoint best|latest] [--config.data.eval_files=...]
    python -m foldax.train.main export-params --workdir runs/x --out params.npz [--checkpoint best|latest]

``--config FILE[:ARG]`` is a Python file with ``get_config()`` (or
``get_config(ARG)``) returning an ``ml_collections.ConfigDict``, or the name of
one of the shipped configs (``default``, ``tiny``, ``synthetic``, ``neural``, ``turner``;
``configs/tiny.py`` also works from any directory, see
:func:`resolve_config_file`); options ``--config.a.b=VALUE`` (or
``--config.a.b VALUE``) override fields, parsed to the field's type as
``ml_collections.config_flags`` does. Data paths are stored absolute in the
run's ``config.json`` (:func:`foldax.train.datasets.absolute_data_paths`). ``train`` on
a workdir that already holds a run resumes it; without ``--config`` it uses the
run's saved ``config.json``. Multi-host: ``--coordinator_address host:port
--num_processes N --process_id I`` (``jax.distributed.initialize``), the same
command on every process.

:func:`main` ``(argv)`` returns the exit status: 0 done (also after a clean
SIGTERM stop), 1 error (message on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import json
import logging
import os
import sys

COMMANDS = ("train", "eval", "export-params")
#: Where the shipped configs live: ``configs/`` of the repository, installed as ``foldax.configs``.
CONFIG_PACKAGES = ("foldax.configs",)

OVERRIDE_HELP = """\
Override any config field with --config.a.b=VALUE (or --config.a.b VALUE); the value is parsed to the
field's type (numbers, true/false, tuples like '(64, 128)'). An unknown field is an error.

examples:
  foldax train --config default --workdir runs/default
  foldax train --config configs/tiny.py --workdir runs/tiny --config.num_train_steps=60 --config.batch_size=16
  foldax train --config default --workdir runs/mine \\
      --config.data.train_files=train.dbn --config.data.valid_files=valid.dbn --config.data.eval_files=test.dbn
  foldax train --workdir runs/default --config.num_train_steps=3000   # resume with a longer schedule

your own data (.dbn .bpseq .ct .tsv; comma-separated files, folders, globs):
  config.data.train_files  training examples
  config.data.valid_files  validation: picks the best checkpoint (default: ~10% of train_files, by sequence hash)
  config.data.eval_files   the test split: final metrics and 'foldax eval' (default: another ~10% of train_files)
"""


def shipped_configs() -> dict[str, str]:
    """``{name: path}`` of the configs shipped with foldax (the ``configs`` package)."""
    for package in CONFIG_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        found = {}
        for folder in spec.submodule_search_locations:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py") and not name.startswith("_"):
                    found.setdefault(name[:-3], os.path.join(folder, name))
        if found:
            return found
    return {}


def resolve_config_file(path: str) -> str:
    """The config file ``path`` names: the file itself if it exists, else a shipped config
    by name (``tiny``, ``tiny.py`` or ``configs/tiny.py``, from any directory).

    >>> os.path.basename(resolve_config_file("tiny"))
    'tiny.py'
    """
    if os.path.exists(path):
        return path
    folder, base = os.path.split(path)
    name = base[:-3] if base.endswith(".py") else base
    shipped = shipped_configs()
    if name in shipped and (not folder or os.path.basename(os.path.normpath(folder)) == "configs"):
        return shipped[name]
    known = ", ".join(shipped) or "none found"
    raise FileNotFoundError(f"config file {path} not found (from {os.getcwd()}); give a path to a .py file "
                            f"with get_config(), or a shipped config name: {known}")


def load_config_file(spec: str):
    """``get_config()`` of a Python file (or shipped config name, see :func:`resolve_config_file`);
    ``FILE:ARG`` passes ARG to ``get_config``."""
    path, _, arg = spec.partition(":")
    path = resolve_config_file(path)
    module_spec = importlib.util.spec_from_file_location(f"_foldax_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _parse_value(text: str, current):
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"expected a bool, got {text!r}")
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        value = ast.literal_eval(text)
        value = value if isinstance(value, (tuple, list)) else (value,)
        return type(current)(value)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(config, overrides: list[tuple[str, str]]):
    """Sets ``config.a.b = VALUE`` for each ``("a.b", "VALUE")``; unknown fields are an error."""
    for path, text in overrides:
        *parents, leaf = path.split(".")
        node = config
        for name in parents:
            if name not in node:
                raise KeyError(f"--config.{path}: no field {name!r} in the config")
            node = node[name]
        if leaf not in node:
            raise KeyError(f"--config.{path}: no field {leaf!r} in the config (fields: {sorted(node.keys())})")
        try:
            value = _parse_value(text, node[leaf])
        except ValueError as err:
            raise ValueError(f"--config.{path}: {err}") from None
        with node.ignore_type():
            node[leaf] = value
    return config


def _split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            key, eq, value = arg[len("--config."):].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{arg} needs a value")
                value = argv[i + 1]
                i += 1
            overrides.append((key, value))
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="foldax", description="Train and evaluate foldax models.",
                                     epilog=OVERRIDE_HELP, formatter_class=formatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train", help="train (or resume) a model in a workdir", formatter_class=formatter, epilog=OVERRIDE_HELP,
        description="Train a model from a config into WORKDIR, or resume the run already there (from its\n"
                    "latest checkpoint; the result is bit-identical to an uninterrupted run). Writes config.json,\n"
                    "checkpoints/, metrics.jsonl, TensorBoard events and summary.json (test metrics of the best\n"
                    "checkpoint). SIGTERM saves a checkpoint and stops.")
    train.add_argument("--config", help="config: a shipped name (default, tiny, synthetic, neural, turner), or a .py file "
                                        "with get_config() (FILE[:ARG]); default: the workdir's config.json")
    train.add_argument("--workdir", required=True, help="output folder (created; an existing run is resumed)")
    train.add_argument("--coordinator_address", "--coordinator-address", default=None,
                       help="host:port of process 0 (multi-host; jax.distributed.initialize)")
    train.add_argument("--num_processes", "--num-processes", type=int, default=None)
    train.add_argument("--process_id", "--process-id", type=int, default=None)
    ev = sub.add_parser("eval", help="test metrics of a run's best (or latest) checkpoint",
                        formatter_class=formatter,
                        epilog="--config.a.b=VALUE overrides fields of the run's config.json, e.g. "
                               "--config.data.eval_files=other.dbn to evaluate on other data.")
    ev.add_argument("--workdir", required=True)
    ev.add_argument("--config", help="config (name or file) to use instead of the workdir's config.json")
    ev.add_argument("--split", default="test", choices=("train", "valid", "test"))
    ev.add_argument("--checkpoint", default="best", choices=("best", "latest"))
    ex = sub.add_parser("export-params", help="write the parameters of a run to a file (.npz, .json, .par) for foldax fold --params and foldax.layers.load_params")
    ex.add_argument("--workdir", required=True)
    ex.add_argument("--out", "--output", dest="out", default=None, help="output .npz, .json or .par (Turner tables; RNAfold -P) (default WORKDIR/params.npz)")
    ex.add_argument("--checkpoint", default="best", choices=("best", "latest"))
    return parser


def _get_config(args, overrides):
    """The config of a command: ``--config`` (or the workdir's ``config.json``) with the
    overrides applied, data paths made absolute (those of a saved config.json only where
    overridden now: its relative paths were relative to where it was written)."""
    from foldax.train.datasets import PATH_FIELDS, absolute_data_paths
    from foldax.train.train import load_config

    if args.config:
        config = load_config_file(args.config)
    else:
        config = load_config(args.workdir)
    config = apply_overrides(config, overrides)
    fields = None if args.config else [path for path, _ in overrides if path in PATH_FIELDS]
    return absolute_data_paths(config, fields=fields)


def _init_distributed(args):
    if args.num_processes is None or args.num_processes <= 1:
        return
    import jax

    if args.coordinator_address is None or args.process_id is None:
        raise ValueError("--num_processes > 1 needs --coordinator_address and --process_id")
    if os.environ.get("JAX_PLATFORMS", "cpu").startswith("cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)


def _setup_logging():
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("foldax").setLevel(logging.INFO)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
    except ImportError:  # pragma: no cover
        pass
    logging.getLogger("absl").addFilter(_quiet_orbax)


_ORBAX_NOISE = ("Requested `tracked_metric`", "read_only=True", "Given directory is read only")


def _quiet_orbax(record: logging.LogRecord) -> bool:
    """Drops Orbax's expected warnings (a save without validation metrics, read-only managers)."""
    message = record.getMessage()
    return not any(text in message for text in _ORBAX_NOISE)


@contextlib.contextmanager
def quiet_orbax():
    """Within the block, Orbax's expected warnings (see :func:`_quiet_orbax`) are dropped
    (for callers outside this command line, e.g. ``foldax fold --params WORKDIR``)."""
    logger = logging.getLogger("absl")
    added = _quiet_orbax not in logger.filters
    logger.addFilter(_quiet_orbax)
    try:
        yield
    finally:
        if added:
            logger.removeFilter(_quiet_orbax)


def main(argv: list[str] | None = None) -> int:
    """Runs one command (``argv`` without the program name, e.g. ``["train", "--config", ...]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rest, overrides = _split_overrides(argv)
    except ValueError as err:
        print(f"foldax: error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(rest)
    except SystemExit as err:
        return 0 if err.code in (0, None) else 2
    if overrides and args.command == "export-params":
        print("foldax export-params: error: --config.* overrides do not apply here", file=sys.stderr)
        return 2
    _setup_logging()
    from foldax.train import train as trainer

    try:
        if args.command == "train":
            _init_distributed(args)
            config = _get_config(args, overrides)
            summary = trainer.train_and_evaluate(config, args.workdir)
            print(json.dumps({k: v for k, v in summary.items() if not k.startswith("data/")}, sort_keys=True))
            return 0
        if args.command == "eval":
            config = _get_config(args, overrides) if (args.config or overrides) else None
            metrics = trainer.evaluate_checkpoint(args.workdir, split=args.split, which=args.checkpoint,
                                                  config=config)
            with open(os.path.join(args.workdir, f"eval_{args.split}.json"), "w") as fh:
                json.dump(metrics, fh, indent=2, sort_keys=True)
            print(json.dumps(metrics, sort_keys=True))
            return 0
        out = args.out or os.path.join(args.workdir, "params.npz")
        print(trainer.export_params(args.workdir, out, which=args.checkpoint))
        return 0
    except trainer.TrainingDiverged as err:
        print(f"foldax {args.command}: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, KeyError, ValueError, trainer.WorkdirError) as err:
        print(f"foldax {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
