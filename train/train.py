"""Training and evaluation of foldax models (in the style of the Flax examples).

:func:`train_and_evaluate` ``(config, workdir)`` trains the model of
``config.model`` on ``config.data`` (see :mod:`foldax.train.datasets`) with the loss
``config.loss`` (:mod:`foldax.model.loss`: the CLL, negative log-likelihood per nucleotide, or
``"expected_f1"``, one minus the expected F1 of the pair probabilities), evaluates on
the validation split every ``eval_every`` steps and, at the end, the best
checkpoint on the test split. :func:`evaluate_checkpoint` and
:func:`export_params` serve ``main eval`` / ``main export-params``;
:func:`restore_for_inference` is what they (and :mod:`foldax.train.compare`) restore
with. Evaluation makes exactly one pass over a split, the training split
included.

Parallelism. One ``jax.sharding.Mesh`` over all devices of all processes with
one axis ``data``; every batch is sharded over it, the parameters and the
optimizer state are replicated, and ``jax.jit`` (GSPMD) inserts the gradient
all-reduce -- no ``pmap``. Each process reads only its own rows of the global
batch (:class:`foldax.train.input_pipeline.InputPipeline` with ``shard_index =
jax.process_index()``) and :func:`jax.make_array_from_process_local_data`
assembles the global array. The loss is a global per-nucleotide mean, so one
step gives the same result (up to float reassociation) on 1 device, 8 devices
or several processes. ``batch_size`` is the *global* batch size and must be a
multiple of the device count.

Checkpoints (Orbax ``CheckpointManager`` in ``<workdir>/checkpoints``): model
parameters, optimizer state and the input pipeline's iterator state, saved
asynchronously every ``checkpoint_every`` steps, at the end, and on SIGTERM or
Ctrl-C. Kept: the latest ``keep_checkpoints`` and the best one by
``best_metric`` on the validation split (``preservation_policy``: ``LatestN``
or ``BestN``). Orbax writes each checkpoint into a temporary directory and
renames it when complete, so an interrupted write is never restored; once it
is committed, foldax adds a manifest of its files' sizes and checksums
(:mod:`foldax.train.checkpointing`). Re-running with the same workdir resumes from the
latest checkpoint exactly (same batches, same parameters: bit-identical to an
uninterrupted run), after three checks (:mod:`foldax.train.checkpointing`): no other
trainer holds the workdir's lock; the config differs from ``config.json`` only
in fields that may change (others stop the run, naming each field); and every
checkpoint verifies against its manifest -- a damaged one is reported in one
line, moved to ``damaged_checkpoints/``, and the run resumes from the newest
one that verifies. A checkpoint that cannot be written (a full disk) stops
the run with :class:`CheckpointError`; the previous one stays the latest.

``config.init = "<workdir of another run>"`` starts a *new* run (step 0, a
fresh optimizer) from that run's best checkpoint: every parameter array whose
name and shape the two models share is copied, the others keep their
initialisation (both are listed). It applies only when the workdir has no
checkpoint yet -- the way to continue from a run whose config cannot change.

Outputs in ``workdir``: ``config.json``, ``config_history.jsonl`` (allowed
config changes at resumes), ``checkpoints/``, ``damaged_checkpoints/`` (if
any), ``train.lock``, TensorBoard event files (``tensorboardX``, if
installed), ``metrics.jsonl`` (every logged scalar), and ``summary.json``
(test metrics of the best checkpoint, steps, wall time).

A non-finite loss or gradient stops training with :class:`TrainingDiverged`;
that step's update is not applied (the step function keeps the old state) and
no checkpoint is written after it, so the last good checkpoint stays the
latest. SIGTERM and the first Ctrl-C (SIGINT) finish the current step, save a
checkpoint and stop (status ``"preempted"``); a second Ctrl-C stops at once
(exit status 130) without saving.

Fault injection, for tests only (environment variables, read when training
starts; never set them otherwise):

* ``FOLDAX_TEST_NAN_AT_STEP=K``: the batch of step ``K`` (1-based) gets NaN
  row weights, so its loss and gradient are NaN -- a divergence through the
  real step function;
* ``FOLDAX_TEST_SLOW_SAVE=K:SECONDS``: the asynchronous save of step ``K``
  waits SECONDS after writing its files, before Orbax commits it (so a test
  can kill the process during a save).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from foldax.layers.compiled import ShapeWatch
from foldax.model.decoding import eval_sums, finalize
from foldax.model.loss import get_loss
from foldax.model.models import create_model, grammar_of
from foldax.train import checkpointing
from foldax.train.checkpointing import CheckpointError, ConfigChanged, WorkdirError, WorkdirLocked
from foldax.train.datasets import describe_splits, load_splits
from foldax.train.input_pipeline import InputPipeline, PipelineConfig

__all__ = [
    "TrainingDiverged",
    "WorkdirError",
    "WorkdirLocked",
    "CheckpointError",
    "ConfigChanged",
    "train_and_evaluate",
    "evaluate_checkpoint",
    "export_params",
    "restore_for_inference",
    "Restored",
    "load_config",
    "make_mesh",
    "create_optimizer",
    "create_state",
    "make_train_step",
]

log = logging.getLogger("foldax.train")

BATCH_KEYS = ("tokens", "lengths", "pair_table", "weights")
PARAM_NAMES = ("stack", "pair", "unpaired", "loop")


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN/inf; the last good checkpoint is kept."""


# --------------------------------------------------------------------------- setup


#: ``config.compilation_cache_dir``'s default; ``$FOLDAX_CACHE_DIR/jax`` instead when that is set ('' = none).
DEFAULT_JAX_CACHE = "~/.cache/foldax/jax"


def setup_jax(config) -> None:
    """Persistent compilation cache (``config.compilation_cache_dir``; '' disables it), and one CPU
    device per core unless the user chose a count or JAX has started (:mod:`foldax.layers.devices`): the
    largest count that divides both batch sizes. Several processes (``jax.distributed``) choose their own."""
    from foldax.layers import devices

    if not jax.distributed.is_initialized():
        devices.default_cpu_devices(divides=int(np.gcd(int(config.batch_size),
                                                      int(config.get("eval_batch_size", config.batch_size)))))
    cache = config.get("compilation_cache_dir", "")
    if cache == DEFAULT_JAX_CACHE and "FOLDAX_CACHE_DIR" in os.environ:  # as foldax fold: elsewhere, or none
        chosen = os.environ["FOLDAX_CACHE_DIR"].strip()
        cache = os.path.join(chosen, "jax") if chosen else ""
    if cache:
        cache = os.path.expanduser(cache)
        os.makedirs(cache, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def make_mesh() -> jax.sharding.Mesh:
    """A 1-axis mesh ``('data',)`` over every device of every process."""
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def check_batch_size(global_batch: int, what: str = "batch_size") -> int:
    """The per-process batch; the global one must split evenly over devices (and processes)."""
    n_dev = jax.device_count()
    if global_batch < 1 or global_batch % n_dev:
        raise ValueError(
            f"config.{what} = {global_batch} must be a positive multiple of the number of devices ({n_dev}): "
            f"each device gets an equal share of the global batch; use e.g. {max(1, global_batch // n_dev) * n_dev}"
        )
    return global_batch // jax.process_count()


def replicate(tree, mesh):
    """Places host values (identical on every process) replicated over the mesh."""
    sharding = NamedSharding(mesh, P())

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def to_global_batch(batch: Mapping[str, np.ndarray], mesh) -> dict:
    """This process's rows -> global arrays sharded over ``data``."""
    sharding = NamedSharding(mesh, P("data"))
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(batch[k])) for k in BATCH_KEYS}


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a run saved in ``<workdir>/config.json``."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir} a training workdir?")
    with open(path) as fh:
        return ml_collections.ConfigDict(json.load(fh))


def _save_config(config, workdir):
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "config.json"), "w") as fh:
            fh.write(config.to_json_best_effort(indent=2, sort_keys=True))


# ------------------------------------------------------------------- model & state


def create_optimizer(config, num_steps: int):
    """``(tx, schedule)`` from ``config.optimizer``: optax chain of gradient clipping and the optimizer."""
    opt = config.optimizer
    lr = float(opt.learning_rate)
    warmup = int(opt.get("warmup_steps", 0))
    kind = opt.get("schedule", "cosine")
    if kind == "constant":
        schedule = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)],
                                        [warmup]) if warmup else optax.constant_schedule(lr)
    elif kind == "cosine":
        schedule = optax.warmup_cosine_decay_schedule(0.0 if warmup else lr, lr, warmup, max(num_steps, warmup + 1),
                                                      end_value=lr * float(opt.get("end_lr_factor", 0.05)))
    else:
        raise ValueError(f"unknown optimizer.schedule {kind!r}; 'cosine' or 'constant'")
    name = opt.get("name", "adam")
    if name == "adam":
        tx = optax.adam(schedule, b1=float(opt.get("b1", 0.9)), b2=float(opt.get("b2", 0.999)))
    elif name == "adamw":
        tx = optax.adamw(schedule, b1=float(opt.get("b1", 0.9)), b2=float(opt.get("b2", 0.999)),
                         weight_decay=float(opt.get("weight_decay", 1e-4)))
    elif name == "sgd":
        tx = optax.sgd(schedule, momentum=float(opt.get("momentum", 0.9)) or None)
    else:
        raise ValueError(f"unknown optimizer.name {name!r}; 'adam', 'adamw' or 'sgd'")
    clip = float(opt.get("grad_clip", 0.0))
    if clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(clip), tx)
    trainable = _names(opt.get("trainable", ""))
    if trainable:
        # Fine-tuning a few tables (e.g. the loop-length and multiloop terms of a Turner model) while
        # the rest stay as initialised: a parameter whose path names none of `trainable` gets no
        # update and no optimizer state.
        def labels(params):
            return jax.tree_util.tree_map_with_path(
                lambda path, _: "train" if trainable & {_key_name(k) for k in path} else "frozen", params)

        tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
    return tx, schedule


def _names(spec) -> set[str]:
    """``"a, b"`` or a sequence of names -> ``{"a", "b"}``."""
    items = spec.split(",") if isinstance(spec, str) else spec
    return {str(item).strip() for item in items if str(item).strip()}


def _key_name(key) -> str:
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def create_state(config, num_steps: int):
    """``(graphdef, state, schedule)``: the model and its ``nnx.Optimizer``, split (host values)."""
    model = create_model(config.model, nnx.Rngs(params=int(config.seed)))
    trainable = _names(config.optimizer.get("trainable", ""))
    if trainable:
        paths = [{_key_name(k) for k in path} for path, _ in jax.tree_util.tree_leaves_with_path(
            nnx.state(model, nnx.Param))]
        unknown = sorted(name for name in trainable if not any(name in names for names in paths))
        if unknown:
            known = sorted(set().union(*paths) - {"value"})
            raise ValueError(f"config.optimizer.trainable names {unknown}, which no parameter of model "
                             f"{config.model.name!r} has; its parameter names are {known}")
    tx, schedule = create_optimizer(config, num_steps)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    return graphdef, state, schedule


def _to_ckpt(state) -> dict:
    pure = nnx.to_pure_dict(state)
    return {"model": pure[0], "optimizer": pure[1]}


def _from_ckpt(state, ckpt: Mapping):
    state = jax.tree.map(lambda x: x, state)  # a copy to fill in
    nnx.replace_by_pure_dict(state, {0: ckpt["model"], 1: ckpt["optimizer"]})
    return state


def _abstract(tree, mesh):
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x), sharding=sharding), tree)


# -------------------------------------------------------------------------- steps


def make_train_step(graphdef, config, schedule, mesh):
    """The jitted step ``(state, batch) -> (state, metrics)``.

    A non-finite loss or gradient norm leaves the state unchanged (``metrics``
    still report it, and the trainer stops).
    """
    l2 = float(config.optimizer.get("l2", 0.0))
    loss_of, data_metric = get_loss(config.get("loss", "cll"))
    replicated = NamedSharding(mesh, P())

    def step(state, batch):
        model, optimizer = nnx.merge(graphdef, state)
        count = optimizer.step[...]

        def loss_fn(model):
            return loss_of(model, batch, l2)

        (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        new_state = nnx.state((model, optimizer))
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, state)
        metrics = {
            "loss": loss,
            data_metric: aux.get(data_metric, aux["data_loss"]),
            "grad_norm": grad_norm,
            "learning_rate": schedule(count),
            "n_invalid": aux["n_invalid"],
            "n_tokens": aux["n_tokens"],
        }
        return new_state, metrics

    return jax.jit(step, donate_argnums=0, out_shardings=replicated)


def make_eval_step(graphdef, config):
    decoders = tuple(config.get("decoders", ("mea", "best")))
    gamma = float(config.get("gamma", 1.0))

    def step(state, batch):
        model = nnx.merge(graphdef, state)
        if isinstance(model, tuple):  # (model, optimizer) of a training state
            model = model[0]
        return eval_sums(model, batch, decoders=decoders, gamma=gamma)

    return jax.jit(step)


#: Each batch shape compiles its own programs: the first time a jitted step meets a shape, check that
#: the process has memory mappings to spare for them (:mod:`foldax.layers.compiled`). Keyed by the
#: step's ``id``: a new run's steps are new functions with programs of their own.
NEW_SHAPES = ShapeWatch()


def evaluate(eval_step, state, pipeline: InputPipeline, mesh) -> dict:
    """Metrics (means) of ``state`` over one pass of ``pipeline``."""
    totals = None
    for batch in pipeline:
        NEW_SHAPES(id(eval_step), batch["tokens"].shape)
        sums = eval_step(state, to_global_batch(batch, mesh))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    return finalize(jax.device_get(totals))


# --------------------------------------------------------------------- checkpoints


def make_checkpoint_manager(workdir: str, config, *, read_only: bool = False):
    import orbax.checkpoint as ocp
    from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

    best_metric = config.get("best_metric", "mea/f1")

    def metric(m):  # a checkpoint saved before best_metric changed may lack it: it ranks last
        return m.get(best_metric, float("-inf"))

    policies = [pp.LatestN(n=int(config.get("keep_checkpoints", 3)))]
    if best_metric:
        policies.append(pp.BestN(get_metric_fn=metric, reverse=False, n=1, keep_checkpoints_without_metrics=False))
    directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    is_async = bool(config.get("async_checkpointing", True))
    slow_save = _slow_save_hook(directory) if is_async and not read_only else None
    options = ocp.CheckpointManagerOptions(
        preservation_policy=pp.AnyPreservationPolicy(policies),
        best_fn=metric if best_metric else None,
        best_mode="max",
        enable_async_checkpointing=is_async,
        async_options=ocp.AsyncOptions(post_finalization_callback=slow_save) if slow_save else None,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(directory, options=options, item_names=("state", "data"))


def _save(manager, step, state, data_iter, metrics=None, force=False):
    import grain
    import orbax.checkpoint as ocp

    args = {"state": ocp.args.StandardSave(_to_ckpt(state))}
    if data_iter is not None:
        args["data"] = grain.checkpoint.CheckpointSave(data_iter)
    return manager.save(step, args=ocp.args.Composite(**args), metrics=metrics, force=force)


def _restore(manager, step, state, mesh, data_iter=None):
    """The state saved at ``step`` (and ``data_iter`` set to its position, if given)."""
    import grain
    import orbax.checkpoint as ocp

    abstract = _abstract(_to_ckpt(state), mesh)
    args = {"state": ocp.args.StandardRestore(abstract)}
    if data_iter is not None:
        args["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    restored = manager.restore(step, args=ocp.args.Composite(**args))
    return _from_ckpt(state, restored["state"])


class _Saver:
    """Saves through the Orbax manager and seals each committed step (:func:`checkpointing.seal`).

    An asynchronous save is sealed once Orbax has committed it (:meth:`poll`
    after every step, :meth:`finish`). A save that fails -- at once or in the
    background, e.g. on a full disk -- raises :class:`CheckpointError` naming
    the step and the latest complete checkpoint.
    """

    def __init__(self, manager, workdir: str, *, latest: int | None):
        self.manager = manager
        self.workdir = workdir
        self.directory = os.path.join(workdir, "checkpoints")
        self.latest_sealed = latest  # newest step known complete
        self.pending: list[int] = []
        self._seals = jax.process_index() == 0

    def save(self, step, state, data_iter, metrics=None) -> None:
        # Orbax would wait for the previous save before starting this one anyway; waiting here first
        # seals it, and a failure stops the run before another save is under way.
        self.finish()
        self.pending.append(step)
        try:
            _save(self.manager, step, state, data_iter, metrics=metrics, force=True)
        except Exception as err:  # noqa: BLE001 - any failed write stops the run the same way
            self._seal_committed(all_done=True)
            raise self._failed(err) from err
        self._seal_committed(all_done=False)

    def poll(self) -> None:
        if self.pending:
            self._seal_committed(all_done=False)

    def finish(self) -> None:
        """Waits for the save in flight, then seals every committed step."""
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as err:  # noqa: BLE001
            self._seal_committed(all_done=True)
            raise self._failed(err) from err
        self._seal_committed(all_done=True)
        if self.pending:
            raise self._failed(RuntimeError(f"Orbax finished without committing step {self.pending[0]}"))

    def _seal_committed(self, *, all_done: bool) -> None:
        """Seals the pending steps Orbax has committed (renamed to their final name).

        Orbax runs one save at a time, and a save is complete once its
        directory has its final name; only the newest save may still be in flight.
        """
        in_flight = None if all_done or not self.manager.is_saving_in_progress() else self.pending[-1]
        for step in list(self.pending):
            path = os.path.join(self.directory, str(step))
            if step == in_flight or not os.path.isdir(path):
                continue
            if self._seals:
                try:
                    checkpointing.seal(path)
                except OSError as err:
                    raise self._failed(err, step=step) from err
            self.pending.remove(step)
            self.latest_sealed = step

    def _failed(self, err: BaseException, *, step: int | None = None) -> CheckpointError:
        step = step if step is not None else self.pending[0] if self.pending else "?"
        latest = self.latest_sealed
        where = (f"the latest complete checkpoint is step {latest} ({os.path.join(self.directory, str(latest))})"
                 if latest else "there is no complete checkpoint yet")
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return CheckpointError(f"could not write the checkpoint of step {step} to {self.directory}: "
                               f"{type(err).__name__}: {reason}. Training stopped; {where}. Fix the cause (e.g. "
                               f"free disk space) and run the same command again to resume.")


def _close_manager(manager) -> None:
    """Closes ``manager`` while another error is already on its way (which must not be masked)."""
    try:
        manager.close()
    except Exception as err:  # noqa: BLE001
        log.debug("closing the checkpoint manager after an error: %s", err)


# ------------------------------------------------------------------ fault injection (tests)


def _nan_injection_step() -> int | None:
    text = os.environ.get("FOLDAX_TEST_NAN_AT_STEP", "").strip()
    return int(text) if text else None


def _slow_save_hook(directory: str):
    """``FOLDAX_TEST_SLOW_SAVE=K:SECONDS``: a callback Orbax runs before committing a save (None if unset)."""
    text = os.environ.get("FOLDAX_TEST_SLOW_SAVE", "").strip()
    if not text:
        return None
    step, _, seconds = text.partition(":")
    step, seconds = int(step), float(seconds)

    def callback():
        import glob

        if glob.glob(os.path.join(directory, f"{step}.orbax-checkpoint-tmp*")):  # this save is step K's
            log.warning("FOLDAX_TEST_SLOW_SAVE: holding the save of step %d for %g s before its commit", step, seconds)
            time.sleep(seconds)

    return callback


# ------------------------------------------------------------------------- logging


class MetricWriter:
    """Scalars to TensorBoard (tensorboardX, when installed) and ``metrics.jsonl``; process 0 only."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self._tb = None
        self._jsonl = None
        if not enabled:
            return
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=workdir, flush_secs=10)
        except ImportError:  # pragma: no cover - optional dependency
            log.warning("tensorboardX is not installed: metrics go to metrics.jsonl only")

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in scalars.items()}
        self._jsonl.write(json.dumps({"step": int(step), **scalars}) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, int(step))

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def _say(message: str) -> None:
    if jax.process_index() == 0:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()


class _Preemption:
    """SIGTERM or Ctrl-C -> a flag the training loop checks after every step (then it saves and exits).

    A second Ctrl-C stops the process at once (exit status 130), without saving.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.flag = False
        self.signal_name = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def _handler(self, signum, frame):
        if signum == signal.SIGINT and self.flag:  # a stop is already under way: the user insists
            os.write(2, b"\nfoldax train: second Ctrl-C: stopped at once, without saving\n")
            os._exit(130)
        if not self.flag:
            self.flag = True
            self.signal_name = signal.Signals(signum).name
            if signum == signal.SIGINT and jax.process_index() == 0:
                os.write(2, b"\nfoldax train: Ctrl-C: saving a checkpoint after this step, then stopping "
                            b"(Ctrl-C again stops at once, without saving)\n")

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def requested(self) -> bool:
        if jax.process_count() == 1:
            return self.flag
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array([self.flag]))))


# ----------------------------------------------------------------------- pipelines


def _pipeline_config(config, *, batch_size: int, train: bool, seed: int) -> PipelineConfig:
    buckets = tuple(int(b) for b in config.data.buckets)
    max_length = int(config.data.get("max_length", 0)) or buckets[-1]
    if not train:
        eval_buckets = config.data.get("eval_buckets", None)
        buckets = tuple(int(b) for b in eval_buckets) if eval_buckets else buckets
        max_length = buckets[-1]
    return PipelineConfig(
        batch_size=batch_size, buckets=buckets, seed=seed, shuffle=train, num_epochs=None if train else 1,
        drop_remainder=train, max_length=min(max_length, buckets[-1]), overlong="drop",
        num_threads=int(config.data.get("num_threads", 2)), prefetch=int(config.data.get("prefetch", 4)),
    )


def _pipelines(config, splits, names, *, training: bool = False):
    """Input pipelines of the ``names`` splits: with ``training``, the ``train`` split's repeats forever
    (shuffled); every other pipeline makes exactly one pass (evaluation, the ``train`` split included)."""
    train_batch = check_batch_size(int(config.batch_size), "batch_size")
    eval_batch = check_batch_size(int(config.get("eval_batch_size", config.batch_size)), "eval_batch_size")
    out = {}
    for name in names:
        train = training and name == "train"
        cfg = _pipeline_config(config, batch_size=train_batch if train else eval_batch, train=train,
                               seed=int(config.seed))
        out[name] = InputPipeline(splits[name], cfg)
        dropped = out[name].stats["n_dropped_overlong"]
        if dropped:
            log.warning("%s: %d examples longer than the largest bucket %d dropped", name, dropped, cfg.buckets[-1])
    return out


# ------------------------------------------------------------------------ training


def _num_steps(config, train_pipe: InputPipeline) -> int:
    steps = int(config.get("num_train_steps", 0))
    if steps <= 0:
        steps = int(config.get("num_epochs", 1)) * train_pipe.steps_per_epoch
    return steps


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains (resuming from ``workdir`` if it has checkpoints), evaluates, writes ``summary.json``.

    Returns the summary dict (``status``: ``"finished"`` or ``"preempted"`` after
    SIGTERM / Ctrl-C). Raises :class:`TrainingDiverged` on a NaN/inf loss, and a
    :class:`WorkdirError` when the workdir is locked by another trainer
    (:class:`WorkdirLocked`), was made with a config that cannot change
    (:class:`ConfigChanged`), or has no checkpoint that verifies, or a checkpoint
    cannot be written (:class:`CheckpointError`).
    """
    t_start = time.time()
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    with checkpointing.WorkdirLock(workdir, process_index=jax.process_index()), _orbax_errors_in_one_line():
        return _train_and_evaluate(config, workdir, t_start)


class _OrbaxErrorsInOneLine(logging.Filter):
    """Orbax logs a failed background save (e.g. a full disk) from several threads, each with a traceback
    and a TensorStore spec; :class:`CheckpointError` then says what happened and what to do. Each of
    those records is shortened to one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "orbax" in record.pathname:
            message = record.getMessage()
            _replace_message(record, message if len(message) <= 300 else message[:300] + " ...")
        return True


def _replace_message(record: logging.LogRecord, text: str) -> None:
    """``record`` says ``text`` only: no arguments, traceback or stack."""
    record.msg, record.args = text, ()
    record.exc_info = record.exc_text = record.stack_info = None


class _OrphanedOrbaxFutures(logging.Filter):
    """asyncio's ``<Task|Future|_GatheringFuture> exception was never retrieved`` about an Orbax write,
    logged (with a traceback) when a failed save's futures are garbage-collected: shortened to one line
    while training runs, and dropped (``drop = True``) once a :class:`CheckpointError` has said it all."""

    _NEVER_RETRIEVED = re.compile(r"\w+ exception was never retrieved")

    def __init__(self):
        super().__init__()
        self.drop = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not (self._NEVER_RETRIEVED.match(message) and _mentions_orbax(message, record.exc_info)):
            return True
        if self.drop:
            return False
        _replace_message(record, message.splitlines()[0] + " (an Orbax write; traceback omitted)")
        return True


def _mentions_orbax(message: str, exc_info) -> bool:
    if "orbax" in message:
        return True
    exc = exc_info[1] if exc_info else None
    return exc is not None and any("orbax" in frame.filename for frame in traceback.extract_tb(exc.__traceback__))


def _event_loop_closed_hook(previous):
    def unraisable(info):
        if not (isinstance(info.exc_value, RuntimeError) and str(info.exc_value) == "Event loop is closed"):
            previous(info)

    return unraisable


@contextlib.contextmanager
def _orbax_errors_in_one_line():
    """:class:`_OrbaxErrorsInOneLine` and :class:`_OrphanedOrbaxFutures`, and silence for the ``Event loop
    is closed`` errors TensorStore's callbacks raise (unraisable, each printed with a traceback) when a
    failed save's event loop is gone.

    After a :class:`CheckpointError` all stay (the orphaned futures are often collected at exit), and
    asyncio's reports of them are dropped: the error said it all.
    """
    absl_logger, one_line = logging.getLogger("absl"), _OrbaxErrorsInOneLine()
    asyncio_logger, orphans = logging.getLogger("asyncio"), _OrphanedOrbaxFutures()
    previous_hook = sys.unraisablehook
    absl_logger.addFilter(one_line)
    asyncio_logger.addFilter(orphans)
    sys.unraisablehook = _event_loop_closed_hook(previous_hook)
    keep = False
    try:
        yield
    except CheckpointError:
        orphans.drop = keep = True
        raise
    finally:
        if not keep:
            absl_logger.removeFilter(one_line)
            asyncio_logger.removeFilter(orphans)
            sys.unraisablehook = previous_hook


def _train_and_evaluate(config, workdir: str, t_start: float) -> dict:
    setup_jax(config)
    mesh = make_mesh()
    is_main = jax.process_index() == 0
    _say(f"foldax train: {jax.process_count()} process(es), {jax.device_count()} device(s) "
         f"({jax.devices()[0].platform}), workdir {workdir}")

    _check_config(config)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    changes = _check_resume_config(config, workdir, resuming=bool(checkpointing.step_dirs(ckpt_dir)))
    min_hairpin = int(config.model.get("min_hairpin", 3))
    splits = load_splits(config.data, min_hairpin=min_hairpin, seed=int(config.seed), grammar=grammar_of(config.model))
    _say("data: " + describe_splits(splits))
    eval_test = bool(config.get("eval_test", True))
    pipes = _pipelines(config, splits, ("train", "valid") + (("test",) if eval_test else ()), training=True)
    num_steps = _num_steps(config, pipes["train"])
    _set_aside_damaged(workdir)

    graphdef, host_state, schedule = create_state(config, num_steps)
    n_params = sum(int(np.size(x)) for x in jax.tree.leaves(nnx.to_pure_dict(host_state)[0]))
    manager = make_checkpoint_manager(workdir, config)
    train_iter = iter(pipes["train"])
    start_step = manager.latest_step() or 0
    if is_main:
        _save_config(config, workdir)
        checkpointing.record_config_changes(workdir, changes, step=start_step)
    if changes and start_step:
        _say("config changes allowed on resume: " + ", ".join(f"{f} {a!r} -> {b!r}" for f, a, b in changes))
    if not start_step and config.get("init", ""):
        host_state = _init_from_run(config, host_state, str(config.init))
    elif start_step and config.get("init", ""):
        log.info("config.init is used only when a run starts; resuming from step %d instead", start_step)

    writer = None
    try:
        with jax.set_mesh(mesh):
            state = replicate(host_state, mesh)
            if start_step:
                state = _restore(manager, start_step, state, mesh, train_iter)
                _say(f"resumed from the checkpoint at step {start_step}")
            train_step = make_train_step(graphdef, config, schedule, mesh)
            eval_step = make_eval_step(graphdef, config)
            writer = MetricWriter(workdir, enabled=is_main)
            saver = _Saver(manager, workdir, latest=start_step or None)
            state, status, train_info = _train_loop(config, workdir, mesh, saver, state, train_step, eval_step,
                                                    train_iter, pipes, start_step, num_steps, writer, schedule)
            summary = {"status": status, "steps": train_info["step"], "num_train_steps": num_steps,
                       "num_params": n_params, "devices": jax.device_count(), "processes": jax.process_count(),
                       "train_steps_per_s": train_info["steps_per_s"], "train_wall_s": train_info["train_wall_s"],
                       "resumed_from_step": start_step, **{f"data/{k}": len(v) for k, v in splits.items()}}
            saver.finish()
            if status == "finished":
                best = manager.best_step() if config.get("best_metric", "mea/f1") else None
                summary["best_step"] = best if best is not None else train_info["step"]
                best_valid = train_info["valid"].get(best) or (manager.metrics(best) if best is not None else None)
                if best_valid:
                    summary.update({f"valid/{k}": v for k, v in best_valid.items()})
            if status == "finished" and eval_test:  # off: the caller evaluates the test split (familyfold)
                eval_state = state
                if best is not None and best != train_info["step"]:
                    eval_state = _restore(manager, best, state, mesh)
                t = time.time()
                test = evaluate(eval_step, eval_state, pipes["test"], mesh)
                summary.update({f"test/{k}": v for k, v in test.items()})
                summary["test_eval_s"] = time.time() - t
                writer.write(train_info["step"], {f"test/{k}": v for k, v in test.items()})
                _say("test: " + _fmt(test))
                if config.data.get("source") == "synthetic" and not config.data.get("train_files"):
                    teacher = _evaluate_teacher(config, pipes["test"], mesh)
                    summary.update({f"teacher/test/{k}": v for k, v in teacher.items()})
                    _say("teacher on test: " + _fmt(teacher))
        manager.close()
    except BaseException:
        _close_manager(manager)  # waits for a save in flight; its own error must not hide this one
        raise
    finally:
        if writer is not None:
            writer.close()
        train_iter.close()
    summary["wall_time_s"] = time.time() - t_start
    if is_main:
        with open(os.path.join(workdir, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2, sort_keys=True)
    return summary


def _check_resume_config(config, workdir: str, *, resuming: bool) -> list:
    """Changes from the workdir's ``config.json`` (all allowed when nothing is resumed; else see
    :func:`checkpointing.check_resume_config`)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        saved = json.load(fh)
    if not resuming:
        return checkpointing.config_changes(saved, config)
    return checkpointing.check_resume_config(workdir, saved, config)


def _set_aside_damaged(workdir: str) -> None:
    """Verifies every checkpoint (process 0), moves damaged ones aside; all processes agree on the outcome."""
    ckpt_dir = os.path.join(workdir, "checkpoints")
    error = ""
    if jax.process_index() == 0:
        checks = checkpointing.scan(ckpt_dir)
        damaged = [c for c in checks if not c.ok]
        for check in damaged:
            moved = checkpointing.set_aside(workdir, check)
            log.warning("damaged checkpoint %s -- moved to %s", checkpointing.describe(check), moved)
        if checks and len(damaged) == len(checks):
            error = (f"no checkpoint in {ckpt_dir} restores completely; tried: "
                     + "; ".join(checkpointing.describe(c) for c in damaged)
                     + f". They were moved to {os.path.join(workdir, checkpointing.DAMAGED_DIR)} (kept, not "
                       f"deleted). Run the same command again to start this run from step 0, or move a good copy "
                       f"of a checkpoint back into {ckpt_dir}.")
        elif checks and not checks[0].verified:
            log.warning("the checkpoints in %s have no manifests (written by an older foldax): used unverified",
                        ckpt_dir)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        failed = bool(multihost_utils.broadcast_one_to_all(np.array(bool(error))))
        error = error or ("process 0 found no checkpoint that restores completely" if failed else "")
    if error:
        raise CheckpointError(error)


def _init_from_run(config, host_state, source: str):
    """``host_state`` with the model parameters of ``source``'s best checkpoint copied in (see ``config.init``)."""
    if not os.path.exists(os.path.join(source, "config.json")):
        raise FileNotFoundError(f"config.init = {source!r}: not a training workdir (no config.json there)")
    restored = restore_for_inference(source, "best")
    restored.manager.close()
    old = _flat_params(jax.device_get(nnx.to_pure_dict(restored.state)[0]))
    pure = nnx.to_pure_dict(host_state)
    new = _flat_params(pure[0])
    shared = sorted(set(old) & set(new))
    clash = [f"{k} {np.shape(old[k])} there, {np.shape(new[k])} here" for k in shared
             if np.shape(old[k]) != np.shape(new[k])]
    if clash:
        raise ConfigChanged(f"config.init = {source}: parameter arrays differ in shape: {'; '.join(clash)}")
    if not shared:
        raise ConfigChanged(f"config.init = {source}: its model ({sorted(old)}) shares no parameter array with "
                            f"this one ({sorted(new)})")
    values = {k: np.asarray(old[k], dtype=np.asarray(new[k]).dtype) for k in shared}
    pure[0] = _unflat_params(pure[0], values)
    nnx.replace_by_pure_dict(host_state, pure)
    fresh = sorted(set(new) - set(old))
    unused = sorted(set(old) - set(new))
    _say(f"initialised {len(shared)} of {len(new)} parameter arrays from {source} (step {restored.step})"
         + (f"; freshly initialised: {', '.join(fresh)}" if fresh else "")
         + (f"; not used: {', '.join(unused)}" if unused else ""))
    return host_state


def _flat_params(tree, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat_params(value, name + "/"))
        else:
            out[name] = value
    return out


def _unflat_params(tree, values: Mapping, prefix: str = ""):
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out[key] = _unflat_params(value, values, name + "/") if isinstance(value, Mapping) else values.get(name, value)
    return out


def _evaluate_teacher(config, pipeline, mesh) -> dict:
    """Test metrics of the synthetic data's teacher parameters (the ceiling a model can reach)."""
    from foldax.model.models import StackingModel
    from foldax.train.datasets import teacher_params

    syn = config.data.synthetic
    params = teacher_params(syn.teacher, scale=float(syn.get("teacher_scale", 1.0)), seed=int(syn.seed))
    teacher = StackingModel(params=params, min_hairpin=int(config.model.get("min_hairpin", 3)),
                            num_chunks=config.model.get("num_chunks", 4) or None)
    graphdef, state = nnx.split(teacher)
    return evaluate(make_eval_step(graphdef, config), replicate(state, mesh), pipeline, mesh)


def _check_config(config) -> None:
    get_loss(config.get("loss", "cll"))  # before the data loads: an unknown name says so at once
    decoders = tuple(config.get("decoders", ("mea", "best")))
    bad = [d for d in decoders if d not in ("mea", "best")]
    if bad:
        raise ValueError(f"config.decoders: unknown {bad}; use 'mea' and/or 'best'")
    metric = config.get("best_metric", "mea/f1")
    if metric and metric != "ll_per_nt":
        decoder, _, name = metric.partition("/")
        from foldax.model.metrics import METRIC_NAMES

        if decoder not in decoders or name not in METRIC_NAMES:
            raise ValueError(f"config.best_metric {metric!r} is not computed: use 'll_per_nt' or "
                             f"'<decoder>/<metric>' with a decoder in {decoders} and a metric in {METRIC_NAMES}")


def _fmt(metrics: Mapping) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def _train_loop(config, workdir, mesh, saver, state, train_step, eval_step, train_iter, pipes, start_step,
                num_steps, writer, schedule):
    from tqdm import tqdm

    is_main = jax.process_index() == 0
    data_metric = get_loss(config.get("loss", "cll"))[1]
    log_every = int(config.get("log_every", 10))
    eval_every = int(config.get("eval_every", 100))
    ckpt_every = int(config.get("checkpoint_every", eval_every))
    bar = tqdm(total=num_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
               disable=not (is_main and config.get("progress_bar", True)), file=sys.stderr)
    step = start_step
    t_loop, steps_done, window, t_window = time.time(), 0, [], time.time()
    valid_history = {}
    t_other = 0.0  # time spent in validation and checkpointing (not in steps/s)
    status = "finished"
    nan_step = _nan_injection_step()
    if step == 0 and saver.latest_sealed is None and config.get("eval_at_start", False):
        # The starting point (e.g. Turner 2004) competes for "best" too: fine-tuning must beat it on validation.
        valid = evaluate(eval_step, state, pipes["valid"], mesh)
        valid_history[0] = valid
        writer.write(0, {f"valid/{k}": v for k, v in valid.items()})
        _say("step 0 valid: " + _fmt(valid))
        saver.save(0, state, train_iter, metrics=valid)
    with _Preemption() as preemption:
        while step < num_steps:
            batch = next(train_iter)
            if step + 1 == nan_step:
                batch = {**batch, "weights": np.full_like(batch["weights"], np.nan)}
            NEW_SHAPES(id(train_step), batch["tokens"].shape)
            state, metrics = train_step(state, to_global_batch(batch, mesh))
            metrics = jax.device_get(metrics)
            step += 1
            steps_done += 1
            if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])):
                saver.finish()
                bar.close()
                latest = saver.latest_sealed
                cause = (f"; {int(metrics['n_invalid'])} reference structure(s) in the batch have probability 0 "
                         f"under the model (not nested or a hairpin shorter than min_hairpin) -- clean the data "
                         f"(config.data.short_hairpins)") if metrics["n_invalid"] else \
                    "; try a lower optimizer.learning_rate or gradient clipping (optimizer.grad_clip)"
                if step == nan_step:
                    cause = " (injected by FOLDAX_TEST_NAN_AT_STEP)"
                raise TrainingDiverged(
                    f"training stopped: non-finite loss {metrics['loss']} / gradient norm {metrics['grad_norm']} at "
                    f"step {step}{cause}. The update was not applied; the last good checkpoint "
                    f"({'step ' + str(latest) if latest is not None else 'none yet'}) is kept in "
                    f"{os.path.join(workdir, 'checkpoints')}.")
            window.append(metrics)
            bar.update(1)
            if step % log_every == 0 or step == num_steps:
                elapsed = time.time() - t_window
                scalars = {f"train/{k}": float(np.mean([m[k] for m in window])) for k in
                           ("loss", data_metric, "grad_norm", "learning_rate")}
                scalars["train/steps_per_s"] = len(window) / max(elapsed, 1e-9)
                writer.write(step, scalars)
                if bar.disable:
                    _say(f"step {step}: " + _fmt({k.split('/', 1)[1]: v for k, v in scalars.items()}))
                else:
                    bar.set_postfix(loss=f"{scalars['train/loss']:.4f}", steps_s=f"{scalars['train/steps_per_s']:.2f}")
                window, t_window = [], time.time()
            valid = None
            t_pause = time.time()
            if step % eval_every == 0 or step == num_steps:
                valid = evaluate(eval_step, state, pipes["valid"], mesh)
                valid_history[step] = valid
                writer.write(step, {f"valid/{k}": v for k, v in valid.items()})
                _say(f"step {step} valid: " + _fmt(valid))
            if valid is not None or step % ckpt_every == 0 or step == num_steps:
                saver.save(step, state, train_iter, metrics=valid)
            saver.poll()
            t_other += time.time() - t_pause
            if valid is not None:
                t_window += time.time() - t_pause  # keep validation out of the logged steps/s
            if preemption.requested():
                if saver.latest_sealed != step and step not in saver.pending:
                    saver.save(step, state, train_iter)
                saver.finish()
                status = "preempted"
                what = "Ctrl-C (SIGINT)" if preemption.signal_name == "SIGINT" else (preemption.signal_name or "signal")
                _say(f"{what}: saved the checkpoint at step {step} and stopped; run the same command again "
                     f"to resume")
                break
    bar.close()
    wall = time.time() - t_loop
    return state, status, {"step": step, "steps_per_s": steps_done / max(wall - t_other, 1e-9),
                           "train_wall_s": wall, "valid": valid_history}


# --------------------------------------------------------------- eval & export


class Restored(NamedTuple):
    """What :func:`restore_for_inference` returns; unpacks as ``config, mesh, manager, graphdef, state, step``."""

    config: ml_collections.ConfigDict  # the config to evaluate with (``config`` if given, else the run's)
    mesh: jax.sharding.Mesh
    manager: object  # a read-only orbax CheckpointManager: close() it when done
    graphdef: object
    state: object  # the (model, optimizer) state, replicated over ``mesh``
    step: int


def restore_for_inference(workdir: str, which: str = "best", config=None) -> Restored:
    """The ``which`` (``"best"`` or ``"latest"``) checkpoint of a training workdir, among those that verify.

    ``config`` (default: the run's ``config.json``) chooses what to evaluate
    (data, decoders, ...); the model is always the run's own, so a ``model.*``
    field that differs (other than :data:`checkpointing.SAFE_FIELDS`) raises
    :class:`ConfigChanged`. A damaged checkpoint is reported in one line and
    skipped -- not moved: that is left to ``foldax train``, which holds the
    workdir's lock -- and ``best`` falls back to the best one that verifies.
    Raises ``FileNotFoundError`` without checkpoints, :class:`CheckpointError`
    when none verifies.

    ``foldax eval`` / ``export-params`` and :mod:`foldax.train.compare` use it::

        config, mesh, manager, graphdef, state, step = restore_for_inference("runs/default")
        manager.close()
    """
    if which not in ("best", "latest"):
        raise ValueError(f"which must be 'best' or 'latest', got {which!r}")
    workdir = os.path.abspath(workdir)
    saved = load_config(workdir)
    if config is None:
        config = saved
    else:
        changed = [(f, a, b) for f, a, b in checkpointing.config_changes(saved, config)
                   if f.startswith("model.") and f not in checkpointing.SAFE_FIELDS]
        if changed:
            raise ConfigChanged(f"{workdir} holds a model made with other settings, which a checkpoint cannot "
                                f"change: " + ", ".join(f"{f} {a!r} -> {b!r}" for f, a, b in changed)
                                + "; drop those --config.model.* overrides (its own model is always used)")
    setup_jax(config)
    mesh = make_mesh()
    ckpt_dir = os.path.join(workdir, "checkpoints")
    checks = checkpointing.scan(ckpt_dir)
    if not checks:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}")
    damaged = [c for c in checks if not c.ok]
    good = [c.step for c in checks if c.ok]
    trainer_pid = checkpointing.running_trainer(workdir)
    for check in list(damaged):
        if trainer_pid and check.unconfirmed and check is checks[0]:  # the trainer is sealing it right now
            log.info("step %d is still being written by the running trainer (pid %d): skipped", check.step,
                     trainer_pid)
            damaged.remove(check)
        else:
            log.warning("damaged checkpoint %s -- skipped", checkpointing.describe(check))
    if not good:
        raise CheckpointError(f"no checkpoint in {ckpt_dir} restores completely; tried: "
                              + "; ".join(checkpointing.describe(c) for c in damaged))
    manager = make_checkpoint_manager(workdir, config, read_only=True)
    try:
        step = _pick_step(manager, good, which, config, any_damaged=bool(damaged))
        if damaged:
            log.warning("using the %s checkpoint that verifies: step %d", which, step)
        graphdef, host_state, _ = create_state(saved, 1)
        with jax.set_mesh(mesh):
            state = _restore(manager, step, replicate(host_state, mesh), mesh)
    except BaseException:
        _close_manager(manager)
        raise
    return Restored(config, mesh, manager, graphdef, state, step)


_restore_for_inference = restore_for_inference  # its name before it became public (used by other modules)


def _pick_step(manager, good: list[int], which: str, config, *, any_damaged: bool) -> int:
    """Latest, or best by ``config.best_metric`` (the latest when no checkpoint has it), of the ``good`` steps."""
    if which == "latest":
        return max(good)
    if not any_damaged:  # Orbax's own choice, as at the end of training
        best = manager.best_step()
        return best if best is not None else max(good)
    metric = config.get("best_metric", "mea/f1")
    scored = [(float(m[metric]), s) for s in good if metric and metric in (m := manager.metrics(s) or {})]
    return max(scored)[1] if scored else max(good)


def evaluate_checkpoint(workdir: str, *, split: str = "test", which: str = "best", config=None) -> dict:
    """Metrics of the ``which`` (``best``/``latest``) checkpoint of ``workdir`` on ``split``."""
    config, mesh, manager, graphdef, state, step = restore_for_inference(workdir, which, config)
    splits = load_splits(config.data, min_hairpin=int(config.model.get("min_hairpin", 3)), seed=int(config.seed),
                         splits=(split,), grammar=grammar_of(config.model))
    pipe = _pipelines(config, splits, (split,))[split]
    with jax.set_mesh(mesh):
        metrics = evaluate(make_eval_step(graphdef, config), state, pipe, mesh)
    manager.close()
    return {"step": step, "split": split, **metrics}


def export_params(workdir: str, out: str, *, which: str = "best") -> str:
    """Writes the ``which`` checkpoint's parameters (the inside layer's) to ``out``; returns ``out``.

    The extension picks the format (:func:`foldax.layers.save_params`): ``.npz`` -- lossless,
    with provenance (for the stacking grammar the float32 ``stack pair unpaired loop``);
    ``.json`` -- lossless, with provenance (either grammar); ``.par``
    -- Turner tables as a ViennaRNA parameter file (rounded to 0.01 kcal/mol). The provenance
    names the workdir, checkpoint, step, its validation metrics, the model and data config and
    the foldax commit. :func:`foldax.layers.load_params` reads all of them back. A neural model's
    ``phi`` network is not exported (a warning says so).
    """
    from foldax import layers

    ext = os.path.splitext(out)[1].lower()
    if ext not in (".npz", ".json", ".par"):
        raise ValueError(f"--out {out}: unknown parameter file type {ext or '(no extension)'!r}; use .npz, .json or "
                         f".par")
    config, mesh, manager, graphdef, state, step = restore_for_inference(workdir, which)
    try:
        model = nnx.merge(graphdef, state)[0]
        params = jax.device_get(model.inside.params_dict())
        metrics = manager.metrics(step) if hasattr(manager, "metrics") else None
    finally:
        manager.close()
    name = config.model.get("name", "stacking")
    if name not in ("stacking", "turner"):
        log.warning("model %s: only the score tensors are exported; its phi network is not", name)
    if jax.process_index() == 0:
        if not layers.is_energy_params(params):
            params = {k: np.asarray(params[k], dtype=np.float32) for k in PARAM_NAMES}
        layers.save_params(params, out, provenance=_export_provenance(config, workdir, which, step, metrics))
    return out


def _export_provenance(config, workdir: str, which: str, step: int, metrics) -> dict:
    """Where exported parameters came from (stored in the file by :func:`foldax.layers.save_params`)."""
    import datetime
    import subprocess

    commit = ""
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # only foldax's own checkout: an installed foldax may sit inside some other git repository
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10, check=True).stdout.split()
        if len(top) == 2 and os.path.isfile(os.path.join(top[0], "layers", "chart.py")):
            commit = top[1]
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        foldax_version = version("foldax")
    except PackageNotFoundError:
        foldax_version = ""
    saved = json.loads(config.to_json_best_effort())
    return {
        "written_by": "foldax export-params",
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "foldax_commit": commit,
        "foldax_version": foldax_version,
        "workdir": os.path.abspath(workdir),
        "checkpoint": which,
        "step": int(step),
        "validation_metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "model": saved.get("model", {}),
        "data": saved.get("data", {}),
        "optimizer": saved.get("optimizer", {}),
        "num_train_steps": saved.get("num_train_steps"),
        "seed": saved.get("seed"),
    }
