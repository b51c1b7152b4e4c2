"""Safe resumes: one trainer per workdir, verified checkpoints, config changes checked first.

:func:`foldax.train.train.train_and_evaluate` runs three checks before Orbax reads
anything from a workdir, and :func:`foldax.train.train.restore_for_inference`
(``foldax eval`` / ``export-params``) runs the second one too.

**1. One trainer per workdir** (:class:`WorkdirLock`). An exclusive
``fcntl.flock`` on ``<workdir>/train.lock`` (``train.<i>.lock`` for process
``i > 0`` of a multi-process run) is held for the whole run. A second ``foldax
train`` on the same workdir stops with :class:`WorkdirLocked`, naming the
process that holds it (the file holds its pid, host and start time). The
operating system drops the lock when its process ends, however it ends (also
on SIGKILL), so a lock file left behind never blocks a later run; the file is
never deleted (deleting a lock file lets two processes lock two different
files). ``flock`` works on local filesystems and, on Linux, on NFS (as a POSIX
lock).

**2. Verified checkpoints** (:func:`seal`, :func:`verify`, :func:`scan`,
:func:`set_aside`). What Orbax (orbax-checkpoint 0.12) guarantees, and what it
does not -- looked up in its docs, issues and 0.12.8 source, and tried:

* a save is atomic: it is written into ``<step>.orbax-checkpoint-tmp-<t>/`` and
  renamed to ``<step>/`` once every file is written, after it wrote its commit
  marker ``commit_success.txt``; an interrupted save is never listed as a step
  (and is deleted by the next run);
* nothing is verified when a checkpoint is *read*. A finalised step whose files
  were truncated, deleted or overwritten later (a full disk, a half-synced copy,
  bit rot) is listed as valid; restoring it fails deep inside TensorStore
  (``OUT_OF_RANGE: Error reading ...``) or, worse, succeeds with wrong values:
  one flipped bit in a data file of a stacking-model checkpoint restored
  ``stack`` scores off by 1.3e37, without any error. A step without
  ``commit_success.txt`` is listed as valid too (on a local filesystem the
  rename is the commit). The only checksum Orbax asks TensorStore for is a
  crc32c of the zarr3 *shard index* (not of the data; the zarr2 layout of
  these checkpoints has none), and there is no option to verify a checkpoint
  (``CheckpointManagerOptions``, ``AsyncOptions`` and the atomicity options
  were checked). So there is no Orbax feature to prefer here.

So after every save has been committed, :func:`seal` writes
``<step>/foldax_manifest.json``: the size and SHA-256 of every file of the
step (including Orbax's commit marker), each file fsynced first, the manifest
written atomically (temporary file, fsync, rename). On resume every step
directory is checked against its manifest (:func:`verify`); a step that fails
-- a file missing, shorter or longer, or with another checksum, the commit
marker missing, the manifest missing or unreadable -- is reported in one line
(step, file, what is wrong) and moved to ``<workdir>/damaged_checkpoints/``
(never deleted; ``damaged_checkpoints/README.txt`` says why), where Orbax
no longer sees it, so it takes no part in ``keep_checkpoints`` or best-N
accounting. Training resumes from the newest step that verifies; when none
does, :class:`CheckpointError` says so and lists what was tried. Sealing and
verifying read every file once (measured on the 2-core CPU: 0.6 GB/s to seal,
fsyncs included, 1 GB/s to verify; about 20 ms for a stacking-model
checkpoint). Sealing runs in the training thread, between steps.

A workdir whose checkpoints have no manifest at all was written by an older
foldax: its checkpoints are used unverified, with a warning. A step without a
manifest next to steps with one is a save that was not confirmed (the
process stopped, or the disk filled, between Orbax's commit and the
manifest), and counts as damaged -- except, for ``foldax eval`` and
``export-params``, the newest step while a live trainer holds the lock (it is
sealing it).

**3. Config changes** (:func:`config_changes`, :func:`check_resume_config`).
Before restoring, the config of the new command is compared with
``<workdir>/config.json``. Fields that change what is in a checkpoint or what
the run computes from it -- everything except :data:`SAFE_FIELDS`: the model
and its sizes, ``min_hairpin``, the optimizer, ``seed``, ``batch_size``, the
training data and buckets -- stop the run with :class:`ConfigChanged`: one line
naming every changed field with its old and new value, and the ways out (the
old values; a new workdir, optionally started from this run's parameters with
``--config.init=<workdir>``). :data:`SAFE_FIELDS` (number of steps, logging,
evaluation and checkpoint cadence, test-split options, performance knobs) may
change; the changes are appended to ``<workdir>/config_history.jsonl``.

>>> config_changes({"model": {"name": "stacking"}, "num_train_steps": 10},
...                {"model": {"name": "neural"}, "num_train_steps": 20})
[('model.name', 'stacking', 'neural'), ('num_train_steps', 10, 20)]
>>> [field for field, *_ in config_changes({"a": 1}, {"a": 1})]
[]
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence

from foldax.train import datasets

__all__ = [
    "WorkdirError", "WorkdirLocked", "CheckpointError", "ConfigChanged", "WorkdirLock",
    "MANIFEST", "COMMIT_MARKER", "DAMAGED_DIR", "SAFE_FIELDS", "LATER_FIELDS",
    "StepCheck", "step_dirs", "seal", "verify", "scan", "set_aside", "describe", "running_trainer",
    "config_changes", "check_resume_config", "record_config_changes",
]

MANIFEST = "foldax_manifest.json"
_UNCONFIRMED = f"{MANIFEST} is missing"
COMMIT_MARKER = "commit_success.txt"  # Orbax's (orbax.checkpoint path.atomicity.COMMIT_SUCCESS_FILE)
DAMAGED_DIR = "damaged_checkpoints"
CONFIG_HISTORY = "config_history.jsonl"

#: Config fields that may change when a run is resumed (dotted names). Everything else changes the
#: model, optimizer, data or schedule the checkpoints were made with.
SAFE_FIELDS = frozenset({
    "num_train_steps", "num_epochs",  # more (or fewer) steps; a cosine schedule stretches with them
    "log_every", "eval_every", "eval_at_start", "checkpoint_every", "keep_checkpoints", "async_checkpointing", "progress_bar",
    "compilation_cache_dir",
    "eval_batch_size", "decoders", "gamma", "best_metric", "eval_test",  # validation / test metrics only
    "init", "model.init", "model.init_scale",  # used only when a run starts
    "model.num_chunks",  # how the DP is chunked, not what it computes
    "data.num_threads", "data.prefetch",
    "data.max_eval_length", "data.eval_buckets", "data.max_valid_examples", "data.max_test_examples",
    "data.synthetic.num_valid", "data.synthetic.num_test",
})

#: Fields added after runs were written, with the value that means what those runs did: a saved
#: config without the field equals one with this value (so older workdirs still resume).
LATER_FIELDS = {"data.max_train_rows_per_family": 0, "optimizer.trainable": "", "loss": "cll"}

#: Fields holding only paths (comma-separated for the ``*_files``), never names: compared after
#: making each path absolute.
PATH_FIELDS = frozenset(field for field, names in datasets.PATH_FIELDS.items() if not names)


class WorkdirError(RuntimeError):
    """A workdir cannot be used as asked; the message says what is wrong and what to do."""


class WorkdirLocked(WorkdirError):
    """Another live process trains in this workdir."""


class CheckpointError(WorkdirError):
    """No checkpoint restores completely, or a checkpoint could not be written."""


class ConfigChanged(WorkdirError, ValueError):
    """The config differs from the run's in fields a resume cannot change."""


# --------------------------------------------------------------------------------- lock


class WorkdirLock:
    """Exclusive ``flock`` on ``<workdir>/train.lock`` while training (a context manager).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with WorkdirLock(d):
    ...         try:
    ...             WorkdirLock(d).acquire()
    ...         except WorkdirLocked as err:
    ...             print("refused:", "train.lock" in str(err))
    refused: True
    """

    def __init__(self, workdir: str, *, process_index: int = 0):
        name = "train.lock" if process_index == 0 else f"train.{process_index}.lock"
        self.workdir = os.path.abspath(workdir)
        self.path = os.path.join(self.workdir, name)
        self._fd = None

    def acquire(self) -> WorkdirLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: a live process holds it
            holder = _read_holder(fd)
            os.close(fd)
            raise WorkdirLocked(
                f"another foldax train{holder} is using {self.workdir} (it holds {self.path}); wait for it to "
                f"finish or stop it (SIGTERM or Ctrl-C saves a checkpoint first), then run this again, or use "
                f"another --workdir") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)  # the file stays (see the module docstring); only its contents go
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder_info(fd: int) -> dict:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else {}


def _read_holder(fd: int) -> str:
    info = _holder_info(fd)
    if not info:
        return ""
    return f" (pid {info['pid']} on {info.get('host', '?')}, started {info.get('started', '?')})"


def running_trainer(workdir: str) -> int | None:
    """The pid of a live ``foldax train`` on ``workdir`` (on this host), from its lock file, else None.

    Read-only: it takes no lock, so it never gets in a trainer's way.
    """
    try:
        fd = os.open(os.path.join(workdir, "train.lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        info = _holder_info(fd)
    finally:
        os.close(fd)
    if not info or info.get("host") != socket.gethostname():
        return None
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    return info["pid"]


# --------------------------------------------------------------------------- manifests


@dataclasses.dataclass(frozen=True)
class StepCheck:
    """The verdict on one step directory: ``problem`` is None when it may be restored."""

    step: int
    path: str
    problem: str | None
    verified: bool  # False: accepted without a manifest (a workdir of an older foldax)

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def unconfirmed(self) -> bool:
        """Complete as far as Orbax knows, but not sealed (see the module docstring)."""
        return bool(self.problem) and self.problem.startswith(_UNCONFIRMED)


def step_dirs(checkpoint_dir: str) -> dict[int, str]:
    """``{step: path}`` of the finalised step directories (all-digit names) in ``checkpoint_dir``."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return {}
    return {int(n): os.path.join(checkpoint_dir, n) for n in names
            if n.isdigit() and os.path.isdir(os.path.join(checkpoint_dir, n))}


def _file_digest(path: str) -> dict:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
        os.fsync(fh.fileno())  # on disk before the manifest says so
    return {"size": size, "sha256": digest}


def _files(step_dir: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(step_dir):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), step_dir)
            if rel not in (MANIFEST, MANIFEST + ".tmp"):
                out.append(rel)
    return out


def seal(step_dir: str) -> dict:
    """Writes ``step_dir/foldax_manifest.json`` (size and SHA-256 of every file); returns it."""
    manifest = {"format": 1, "step": int(os.path.basename(os.path.normpath(step_dir))),
                "files": {rel: _file_digest(os.path.join(step_dir, rel)) for rel in _files(step_dir)}}
    tmp = os.path.join(step_dir, MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(step_dir, MANIFEST))
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)
    return manifest


def verify(step_dir: str, *, require_manifest: bool = True) -> str | None:
    """None if ``step_dir`` matches its manifest, else what is wrong (one line, without the step).

    ``require_manifest=False`` accepts a step without a manifest (nothing to check).
    """
    manifest_path = os.path.join(step_dir, MANIFEST)
    if not os.path.exists(manifest_path):
        if not require_manifest:
            return None
        if not os.path.exists(os.path.join(step_dir, COMMIT_MARKER)):
            return f"neither Orbax's commit marker {COMMIT_MARKER} nor {MANIFEST} is there: the save never completed"
        return f"{_UNCONFIRMED}: the save was never confirmed complete (the trainer stopped while finishing it)"
    try:
        with open(manifest_path) as fh:
            files = json.load(fh)["files"]
        wanted = {str(rel): (int(v["size"]), str(v["sha256"])) for rel, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__}: {err})"
    problems = []
    marker_missing = COMMIT_MARKER in wanted and not os.path.isfile(os.path.join(step_dir, COMMIT_MARKER))
    if marker_missing:
        problems.append(f"Orbax's commit marker {COMMIT_MARKER} is missing")
    for rel, (size, sha) in sorted(wanted.items()):
        path = os.path.join(step_dir, rel)
        if rel == COMMIT_MARKER and marker_missing:
            continue
        if not os.path.isfile(path):
            problems.append(f"{rel} is missing")
            continue
        actual = os.path.getsize(path)
        if actual != size:
            how = "truncated" if actual < size else "longer than written"
            problems.append(f"{rel} has {actual} bytes where {size} were written ({how})")
        elif _file_digest(path)["sha256"] != sha:
            problems.append(f"{rel} is corrupted (same size, different SHA-256)")
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
    return problems[0] + more


def scan(checkpoint_dir: str) -> list[StepCheck]:
    """Every step directory of ``checkpoint_dir``, newest first, with its verdict (:func:`verify`).

    Manifests are required once any step has one (see the module docstring).
    """
    steps = step_dirs(checkpoint_dir)
    sealed = any(os.path.exists(os.path.join(p, MANIFEST)) for p in steps.values())
    return [StepCheck(step, path, verify(path, require_manifest=sealed), sealed)
            for step, path in sorted(steps.items(), reverse=True)]


def describe(check: StepCheck) -> str:
    """``step 30 (W/checkpoints/30): state/d/ab12 has 20 bytes where 915 were written (truncated)``."""
    return f"step {check.step} ({check.path}): {check.problem}"


def set_aside(workdir: str, check: StepCheck) -> str:
    """Moves a damaged step directory to ``<workdir>/damaged_checkpoints/`` (never deletes it); the new path."""
    target_dir = os.path.join(workdir, DAMAGED_DIR)
    os.makedirs(target_dir, exist_ok=True)
    target, k = os.path.join(target_dir, str(check.step)), 1
    while os.path.exists(target):
        k += 1
        target = os.path.join(target_dir, f"{check.step}.{k}")
    shutil.move(check.path, target)  # a rename on one filesystem; copy-then-delete across two
    with open(os.path.join(target_dir, "README.txt"), "a") as fh:
        fh.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} {os.path.basename(target)}: "
                 f"step {check.step}, moved from {check.path}: {check.problem}\n")
    return target


# ------------------------------------------------------------------------ config changes

class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()  # a field one of the two configs does not have


def _flatten(tree: Mapping, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _normalised(field: str, value):
    if isinstance(value, tuple):
        value = list(value)
    if field in PATH_FIELDS and isinstance(value, str) and value:
        return ",".join(os.path.normpath(os.path.abspath(os.path.expanduser(p.strip())))
                        for p in value.split(",") if p.strip())
    return value


def as_dict(config) -> dict:
    """A config (``ConfigDict`` or mapping) as plain JSON data, as ``config.json`` holds it."""
    if hasattr(config, "to_json_best_effort"):
        return json.loads(config.to_json_best_effort())
    return json.loads(json.dumps(config, default=str))


def config_changes(old: Mapping, new: Mapping) -> list[tuple[str, object, object]]:
    """``[(field, old value, new value)]`` of the leaves that differ (dotted names, sorted)."""
    a, b = _flatten(as_dict(old)), _flatten(as_dict(new))
    out = []
    for field in sorted(set(a) | set(b)):
        x, y = (c.get(field, LATER_FIELDS.get(field, _ABSENT)) for c in (a, b))
        if _normalised(field, x) != _normalised(field, y):
            out.append((field, x, y))
    return out


def check_resume_config(workdir: str, old: Mapping, new: Mapping) -> list[tuple[str, object, object]]:
    """The allowed changes from ``old`` (the run's ``config.json``) to ``new``; :class:`ConfigChanged` otherwise."""
    changes = config_changes(old, new)
    blocked = [c for c in changes if c[0] not in SAFE_FIELDS]
    if blocked:
        listing = ", ".join(f"{field} {x!r} -> {y!r}" for field, x, y in blocked)
        raise ConfigChanged(
            f"{workdir} holds a run with another config, and these fields cannot change when it resumes: "
            f"{listing}. To continue that run, drop --config (its config.json is used) or pass the old values; "
            f"to start a new run from its parameters, use a new workdir with --config.init={workdir}")
    return changes


def record_config_changes(workdir: str, changes: Sequence[tuple[str, object, object]], *, step: int) -> None:
    """Appends the allowed changes (and the step they apply from) to ``<workdir>/config_history.jsonl``."""
    if not changes:
        return
    entry = {"time": datetime.datetime.now().isoformat(timespec="seconds"), "from_step": int(step),
             "changes": {field: [x if x is not _ABSENT else None, y if y is not _ABSENT else None]
                         for field, x, y in changes}}
    with open(os.path.join(workdir, CONFIG_HISTORY), "a") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
