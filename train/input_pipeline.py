"""Input pipeline: shuffled, length-bucketed, padded, sharded and resumable batches.

Each batch is a dict of numpy arrays (``B`` = per-process batch size, ``L`` =
one of the static bucket lengths, the same on every process at a given step)::

    tokens        int32 [B, L]  A=0 C=1 G=2 U=3 N=4; PAD_TOKEN (4) beyond a length
    lengths       int32 [B]     0 for padding rows
    pair_table    int32 [B, L]  0-based partner or -1 (also -1 in all padding)
    weights       float32 [B]   1.0 for real rows, 0.0 for padding rows
    example_index int32 [B]     index into the examples given, -1 for padding rows

How batches are formed, for each epoch ``e`` (all of it is a function of
``(seed, e)``, so every process computes the same global schedule):

1. examples longer than ``max_length`` (default: the largest bucket) are
   dropped, truncated (pairs reaching past the cut are removed) or an error,
   as configured, and counted in :attr:`InputPipeline.stats`;
2. each example goes to the smallest bucket ``>= length``;
3. the examples are permuted with ``np.random.default_rng([seed, e])``, cut
   per bucket into *global* batches of ``batch_size * shard_count`` examples,
   and the batches are permuted again. A bucket's leftover (fewer than a global
   batch) is dropped with ``drop_remainder=True`` (training: different
   examples each epoch); otherwise it moves up into the next bucket, so only
   one partial batch per epoch remains, padded with weight-0 rows (every
   example is seen exactly once per epoch; a few are padded one bucket wider);
4. process ``shard_index`` takes rows ``[shard_index * B, (shard_index + 1) * B)``
   of every global batch -- shards are disjoint, cover every example, and all
   processes take the same number of steps with the same ``L``.

Why Grain (not tf.data): the schedule above makes batch ``k`` a pure function
of ``k``, which is exactly Grain's random-access ``MapDataset``; Grain then
adds thread prefetching and an iterator whose state (``get_state()`` /
``set_state()``, a small JSON dict) restores the exact position and is saved
with Orbax through ``grain.checkpoint.CheckpointSave`` /
``CheckpointRestore``. It needs no TensorFlow, and it reads TFDS
``array_record`` data sources directly. The state carries a fingerprint of the
data and configuration, so restoring into a different pipeline is an error,
not a silently different batch sequence.

>>> examples = [{"sequence": "GGGAAACCC", "pair_table": [8, 7, 6, -1, -1, -1, 2, 1, 0]},
...             {"sequence": "ACGU", "pair_table": [-1, -1, -1, -1]}]
>>> pipe = InputPipeline(examples, PipelineConfig(batch_size=2, buckets=(16, 32), num_epochs=1,
...                                               shard_index=0, shard_count=1))
>>> [batch] = list(pipe)
>>> batch["tokens"].shape, sorted(batch["lengths"].tolist()), batch["weights"].tolist()
((2, 16), [4, 9], [1.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
from collections.abc import Mapping, Sequence

import grain
import numpy as np

from foldax.layers.alphabet import DEFAULT_BUCKETS, PAD_TOKEN, encode

__all__ = ["PipelineConfig", "InputPipeline", "padding_stats", "suggest_buckets"]

OVERLONG_POLICIES = ("drop", "truncate", "error")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Options of :class:`InputPipeline` (see the module docstring).

    Attributes:
      batch_size: rows per batch on this process.
      buckets: increasing static lengths a batch is padded to.
      seed: shuffling seed.
      shuffle: False keeps the examples' order within each bucket and the
        buckets in increasing order (for evaluation).
      num_epochs: passes over the data; None repeats forever.
      drop_remainder: drop each bucket's last partial batch (True) or pad it
        with weight-0 rows (False: every example is seen once per epoch).
      max_length: longest example kept as is; default ``buckets[-1]`` (which it
        may not exceed).
      overlong: what to do with longer examples: ``"drop"``, ``"truncate"``
        (to ``max_length``, removing pairs that reach past the cut) or
        ``"error"``.
      shard_index, shard_count: this process's shard; default
        ``jax.process_index()`` and ``jax.process_count()``.
      num_threads, prefetch: Grain read threads and prefetch buffer (batches).
    """

    batch_size: int = 32
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    drop_remainder: bool = False
    max_length: int | None = None
    overlong: str = "drop"
    shard_index: int | None = None
    shard_count: int | None = None
    num_threads: int = 2
    prefetch: int = 8

    def resolved(self) -> PipelineConfig:
        """A copy with the defaults filled in (shards from JAX), checked."""
        shard_index, shard_count = self.shard_index, self.shard_count
        if shard_index is None or shard_count is None:
            import jax

            shard_index = jax.process_index() if shard_index is None else shard_index
            shard_count = jax.process_count() if shard_count is None else shard_count
        buckets = tuple(int(b) for b in self.buckets)
        max_length = buckets[-1] if self.max_length is None else int(self.max_length)
        if not buckets or any(a >= b for a, b in zip(buckets, buckets[1:])) or buckets[0] < 1:
            raise ValueError(f"buckets must be positive and increasing, got {self.buckets}")
        if max_length > buckets[-1]:
            raise ValueError(f"max_length {max_length} exceeds the largest bucket {buckets[-1]}")
        if not 0 <= shard_index < shard_count:
            raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {self.overlong!r}")
        if self.batch_size < 1 or (self.num_epochs is not None and self.num_epochs < 1):
            raise ValueError("batch_size and num_epochs must be positive")
        return dataclasses.replace(
            self, buckets=buckets, max_length=max_length, shard_index=shard_index, shard_count=shard_count
        )


def _fields(example) -> tuple[str, np.ndarray]:
    """``(sequence, pair_table)`` of an RnaRecord, a dict, or a TFDS example (bytes)."""
    if isinstance(example, Mapping):
        sequence, pair_table = example["sequence"], example["pair_table"]
    else:
        sequence, pair_table = example.sequence, example.pair_table
    if isinstance(sequence, bytes):
        sequence = sequence.decode()
    if pair_table is None:
        raise ValueError("example has no structure (pair_table is None)")
    return sequence, np.asarray(pair_table, dtype=np.int32)


def _checked_length(example, index: int) -> int:
    try:
        sequence, pair_table = _fields(example)
    except ValueError as err:
        raise ValueError(f"example {index}: {err}") from None
    if len(pair_table) != len(sequence):
        raise ValueError(f"example {index}: pair table length {len(pair_table)} != sequence length {len(sequence)}")
    return len(sequence)


class InputPipeline:
    """Batches of ``examples`` (see the module docstring); iterate it for a Grain iterator.

    Args:
      examples: a random-access sequence (list, TFDS data source, ...) of
        :class:`foldax.data.formats.RnaRecord` or dicts with ``sequence`` and
        ``pair_table``. Read once here (for the lengths) and again per batch.
      config: :class:`PipelineConfig`.

    ``iter(pipeline)`` returns a fresh ``grain.DatasetIterator`` starting at
    step 0; its ``get_state()`` / ``set_state()`` save and restore the position.
    """

    def __init__(self, examples: Sequence, config: PipelineConfig = PipelineConfig()):
        self.config = config.resolved()
        self._examples = examples
        cfg = self.config
        lengths = np.array([_checked_length(ex, i) for i, ex in enumerate(examples)], dtype=np.int64)
        overlong = lengths > cfg.max_length
        if overlong.any() and cfg.overlong == "error":
            i = int(np.flatnonzero(overlong)[0])
            raise ValueError(f"example {i} has length {lengths[i]} > max_length {cfg.max_length}")
        keep = ~overlong if cfg.overlong == "drop" else np.ones(len(lengths), bool)
        self._index = np.flatnonzero(keep)  # examples used, in order
        self._lengths = np.minimum(lengths[self._index], cfg.max_length)
        self._bucket = np.searchsorted(np.array(cfg.buckets), self._lengths)  # bucket id per used example
        self.stats = {
            "n_examples": len(lengths),
            "n_used": len(self._index),
            "n_dropped_overlong": int(overlong.sum()) if cfg.overlong == "drop" else 0,
            "n_truncated": int(overlong.sum()) if cfg.overlong == "truncate" else 0,
        }
        self._global_batch = cfg.batch_size * cfg.shard_count
        self.steps_per_epoch = len(self._epoch_batches(0))
        if self.steps_per_epoch == 0:
            raise ValueError(f"no batches: {len(self._index)} usable examples for global batch {self._global_batch}")
        self._fingerprint = self._make_fingerprint(lengths)
        self._description = self._describe(lengths)
        self._cache: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- schedule

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """Global batches of epoch ``epoch``: arrays of positions into ``self._index``."""
        cfg, size = self.config, self._global_batch
        rng = np.random.default_rng([cfg.seed, epoch])
        order = rng.permutation(len(self._index)) if cfg.shuffle else np.arange(len(self._index))
        order = order[np.argsort(self._bucket[order], kind="stable")]  # group by bucket, keep order inside
        batches, carry = [], order[:0]
        for members in np.split(order, np.flatnonzero(np.diff(self._bucket[order])) + 1):
            if not cfg.drop_remainder:  # a smaller bucket's leftovers move up
                members = np.concatenate([carry, members])
            full = len(members) - len(members) % size
            batches.extend(members[start : start + size] for start in range(0, full, size))
            carry = members[full:]
        if len(carry) and not cfg.drop_remainder:
            batches.append(carry)
        if cfg.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _batches(self, epoch: int) -> list[np.ndarray]:
        with self._lock:
            if epoch not in self._cache:
                if len(self._cache) >= 2:
                    self._cache.pop(min(self._cache))
                self._cache[epoch] = self._epoch_batches(epoch)
            return self._cache[epoch]

    def _global_rows(self, step: int) -> tuple[np.ndarray, int]:
        """Positions into the used examples of a step's global batch (-1 = padding), and its width."""
        batch = self._batches(step // self.steps_per_epoch)[step % self.steps_per_epoch]
        padded = np.full(self._global_batch, -1, dtype=np.int64)
        padded[: len(batch)] = batch
        return padded, self.config.buckets[int(self._bucket[batch].max())]

    def _shard_rows(self, padded: np.ndarray, shard: int) -> np.ndarray:
        size = self.config.batch_size
        return padded[shard * size : (shard + 1) * size]

    # ------------------------------------------------------------------ batches

    def make_batch(self, step: int) -> dict[str, np.ndarray]:
        """The batch of step ``step`` (0-based over all epochs) for this process."""
        padded, width = self._global_rows(step)
        rows = self._shard_rows(padded, self.config.shard_index)
        cfg = self.config
        out = {
            "tokens": np.full((cfg.batch_size, width), PAD_TOKEN, dtype=np.int32),
            "lengths": np.zeros(cfg.batch_size, dtype=np.int32),
            "pair_table": np.full((cfg.batch_size, width), -1, dtype=np.int32),
            "weights": np.zeros(cfg.batch_size, dtype=np.float32),
            "example_index": np.full(cfg.batch_size, -1, dtype=np.int32),
        }
        for row, pos in enumerate(rows.tolist()):
            if pos < 0:
                continue
            index = int(self._index[pos])
            tokens, pair_table = self._encoded(index)
            n = len(tokens)
            out["tokens"][row, :n] = tokens
            out["pair_table"][row, :n] = pair_table
            out["lengths"][row] = n
            out["weights"][row] = 1.0
            out["example_index"][row] = index
        return out

    def _encoded(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and pair table of example ``index``, truncated to ``max_length``."""
        sequence, pair_table = _fields(self._examples[index])
        limit = self.config.max_length
        tokens = encode(sequence[:limit])
        pair_table = pair_table[:limit].copy()
        pair_table[pair_table >= limit] = -1  # partner cut away by truncation
        return tokens, pair_table

    # ------------------------------------------------------------------- grain

    @property
    def num_steps(self) -> int:
        """Steps in total (``sys.maxsize`` when repeating forever)."""
        epochs = self.config.num_epochs
        return sys.maxsize if epochs is None else epochs * self.steps_per_epoch

    def dataset(self) -> grain.IterDataset:
        """The Grain dataset of batches (prefetched with ``num_threads`` threads)."""
        cfg = self.config
        ds = grain.MapDataset.range(self.num_steps).map(self.make_batch)
        options = grain.ReadOptions(num_threads=cfg.num_threads, prefetch_buffer_size=cfg.prefetch)
        return _Fingerprinted(ds.to_iter_dataset(options), self._fingerprint, self._description)

    def __iter__(self) -> grain.DatasetIterator:
        return iter(self.dataset())

    def _make_fingerprint(self, lengths: np.ndarray) -> str:
        cfg = dataclasses.asdict(self.config)
        for key in ("num_threads", "prefetch"):  # performance only
            cfg.pop(key)
        digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
        digest.update(lengths.tobytes())
        return digest.hexdigest()[:16]

    def _describe(self, lengths: np.ndarray) -> dict:
        """What the fingerprint covers, in words a mismatch can be explained with (kept in the state)."""
        cfg = dataclasses.asdict(self.config)
        for key in ("num_threads", "prefetch"):
            cfg.pop(key)
        return {"config": json.loads(json.dumps(cfg)), "n_examples": int(len(lengths)),
                "examples": hashlib.sha256(lengths.tobytes()).hexdigest()[:16]}

    # ------------------------------------------------------------------- stats

    def padding_stats(self, epoch: int = 0, *, all_shards: bool = False) -> dict[str, float]:
        """Padding of one epoch on this shard (or all shards): see :func:`padding_stats`."""
        shards = range(self.config.shard_count) if all_shards else [self.config.shard_index]
        lengths, widths = [], []
        for step in range(epoch * self.steps_per_epoch, (epoch + 1) * self.steps_per_epoch):
            padded, width = self._global_rows(step)
            for shard in shards:
                rows = self._shard_rows(padded, shard)
                lengths.append(np.where(rows >= 0, self._lengths[np.maximum(rows, 0)], 0))
                widths.append(width)
        return padding_stats(lengths, widths)


def padding_stats(row_lengths: Sequence[np.ndarray], widths: Sequence[int]) -> dict[str, float]:
    """Waste of padded batches: per batch the real lengths (0 = padding row) and the width.

    Returns ``token_waste`` (padded positions / all positions), ``cubic_waste``
    (the same weighted by length^3, i.e. the share of an O(L^3) DP's work spent
    on padding) and ``padding_rows`` (share of weight-0 rows).

    >>> padding_stats([np.array([3, 4]), np.array([8, 0])], [4, 8])["token_waste"]
    0.375
    """
    real = sum(float(np.sum(lens)) for lens in row_lengths)
    total = sum(len(lens) * w for lens, w in zip(row_lengths, widths))
    real3 = sum(float(np.sum(np.asarray(lens, dtype=np.float64) ** 3)) for lens in row_lengths)
    total3 = sum(len(lens) * float(w) ** 3 for lens, w in zip(row_lengths, widths))
    rows = sum(len(lens) for lens in row_lengths)
    empty = sum(int(np.sum(np.asarray(lens) == 0)) for lens in row_lengths)
    return {
        "token_waste": 1.0 - real / total,
        "cubic_waste": 1.0 - real3 / total3,
        "padding_rows": empty / rows,
        "num_batches": len(widths),
    }


def suggest_buckets(lengths, num_buckets: int, *, multiple_of: int = 16, power: float = 1.0) -> tuple[int, ...]:
    """Bucket lengths minimising padding cost for a length distribution (exact DP).

    Minimises ``sum over examples of bucket(length) ** power`` over all sets of
    at most ``num_buckets`` multiples of ``multiple_of`` (the last one covering
    the longest example). ``power=1`` minimises padded tokens, ``power=3`` the
    work of an O(L^3) dynamic program. Ignores the partial batches.

    >>> suggest_buckets([10, 12, 30, 31, 100], 2, multiple_of=8)
    (32, 104)
    """
    widths = -(-np.asarray(lengths, dtype=np.int64) // multiple_of) * multiple_of
    cand, counts = np.unique(widths, return_counts=True)
    m, k = len(cand), min(num_buckets, len(cand))
    below = np.concatenate([[0], np.cumsum(counts)])  # examples with width < cand[a]: below[a]
    price = cand.astype(np.float64) ** power
    # cost[a, b]: candidates a..b padded to cand[b]
    cost = np.where(np.arange(m)[:, None] <= np.arange(m), (below[1:][None, :] - below[:-1][:, None]) * price, np.inf)
    best = cost[0]  # best[b]: candidates 0..b covered by buckets so far, the last one cand[b]
    starts = []
    for _ in range(1, k):  # add one bucket: best'[b] = min over a >= 1 of best[a - 1] + cost[a, b]
        total = np.concatenate([[np.inf], best[:-1]])[:, None] + cost
        starts.append(np.argmin(total, axis=0))
        best = total.min(axis=0)
    out, b = [int(cand[-1])], m - 1
    for start in reversed(starts):
        b = int(start[b]) - 1
        out.append(int(cand[b]))
    return tuple(sorted(out))


class _Fingerprinted(grain.IterDataset):
    """Adds a fingerprint of the pipeline to the iterator state and checks it on restore."""

    def __init__(self, parent: grain.IterDataset, fingerprint: str, description: dict | None = None):
        super().__init__(parent)
        self._fingerprint = fingerprint
        self._description = description or {}

    def __iter__(self) -> grain.DatasetIterator:
        return _FingerprintedIterator(self._parent.__iter__(), self._fingerprint, self._description)


def _mismatch_message(saved: Mapping, fingerprint: str, description: Mapping) -> str:
    """Why a saved iterator state (``saved``) does not fit this pipeline, and what to do instead.

    >>> now = {"config": {"batch_size": 16, "seed": 0}, "n_examples": 96, "examples": "ab"}
    >>> _mismatch_message({"pipeline": "x", "config": {"batch_size": 8, "seed": 0}, "n_examples": 96,
    ...                    "examples": "ab"}, "y", now).split(" (fingerprint")[0]
    'the input-pipeline position saved in the checkpoint is from a different pipeline: batch_size 8 -> 16'
    """
    old_cfg, new_cfg = saved.get("config"), description.get("config", {})
    if isinstance(old_cfg, Mapping):
        what = [f"{k} {old_cfg.get(k)!r} -> {new_cfg.get(k)!r}" for k in sorted(set(old_cfg) | set(new_cfg))
                if old_cfg.get(k) != new_cfg.get(k)]
        if saved.get("examples") != description.get("examples"):
            what.append(f"the training examples ({saved.get('n_examples')} then, {description.get('n_examples')} "
                        f"now, or other lengths)")
        what = ", ".join(what) or "unknown differences"
    else:  # a state saved before the description was kept
        what = "data, seed, buckets, batch size or number of processes"
    hint = ("batch_size is per process here: the global batch size or the number of processes changed; "
            if isinstance(old_cfg, Mapping) and old_cfg.get("batch_size") != new_cfg.get("batch_size") else "")
    return (f"the input-pipeline position saved in the checkpoint is from a different pipeline: {what} "
            f"(fingerprint {saved.get('pipeline')!r}, now {fingerprint!r}); {hint}resume with the settings the "
            f"run was started with, or start a new run in a new workdir (--config.init=<this workdir> starts it "
            f"from this run's parameters)")


class _FingerprintedIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, fingerprint: str, description: dict | None = None):
        super().__init__(parent)
        self._fingerprint = fingerprint
        self._description = description or {}

    def __next__(self):
        return next(self._parent)

    def get_state(self) -> dict:
        return {"pipeline": self._fingerprint, **self._description, "iterator": self._parent.get_state()}

    def start_prefetch(self) -> None:
        self._parent.start_prefetch()

    def close(self) -> None:
        self._parent.close()

    def set_state(self, state: dict) -> None:
        if state.get("pipeline") != self._fingerprint:
            raise ValueError(_mismatch_message(state, self._fingerprint, self._description))
        self._parent.set_state(state["iterator"])
