"""Compiled fold programs for ``foldax fold``: one XLA program per batch shape, kept across runs.

Everything ``foldax fold`` prints for a batch comes out of one jit-compiled function,
:func:`fold_batch`, built from the public :mod:`foldax.layers` functions:

* the best structure and its score together (:func:`foldax.layers.best_structure` with
  ``with_score``: the max semiring's charts, ``max_s score(s)`` and its structure, read off
  the charts as :func:`decode_method` says);
* with ``-p``, ``log Z`` and the pair probabilities ``P = d log Z / d phi`` in one
  inside + outside pass (what :func:`foldax.layers.log_partition` and
  :func:`foldax.layers.pair_probs` compute), then the MEA structure
  (:func:`foldax.layers.mea_structure`) and, for an energy model, the centroid structure
  (pairs with ``P > 1/2``) and the free energies of the structures it prints
  (:func:`foldax.layers.free_energy`, RNAfold's ``eval_structure``).

A command-line call spends its time in three places: starting Python and importing
JAX (the floor), *tracing* the Python code of the DP into a program, and *compiling*
that program with XLA. :class:`FoldPrograms` removes the last two from every run but
the first: each compiled program is saved, with
:mod:`jax.experimental.serialize_executable`, in a cache directory (:func:`cache_dir`:
``~/.cache/foldax/programs`` or ``$FOLDAX_CACHE_DIR``; private to the user, as loading a
program runs its code) and loaded back in a fraction of a second. Its file name is a
hash of everything the program depends on (:func:`program_key`: the request, the
shapes and dtypes of the inputs, the parameters' tree, the devices and the CPU, the
versions of JAX and jaxlib, and the source code of :mod:`foldax.layers` and of this module),
so an edit or an upgrade makes new programs, never stale ones.

Why not JAX's persistent compilation cache (``jax_compilation_cache_dir``)? It skips
XLA's compile but not the tracing, which for the Turner grammar costs seconds; and an
executable that JAX loaded from that cache, saved again, fails when run (``NOT_FOUND:
Function ... not found``, jax 0.12). So a program compiled from JAX's cache (when the
user enabled it) is not saved here, and a saved program that fails on its first run
is deleted and compiled again.

Shapes come in buckets (:data:`foldax.layers.DEFAULT_BUCKETS`: a 100-nt sequence runs in the
128 program) and batch sizes are powers of two, so a new length or a new file
reuses programs. A program for one sequence of up to 512 nt runs the DP as a single chunk
of diagonals (:func:`num_chunks_for`): it compiles about four times faster, and that compile is
what the first call waits for. A batch of ``B >= 2`` sequences is split over the local devices
(one per core on CPU, :mod:`foldax.layers.devices`): the program is compiled for that mesh.
Without a directory (``FoldPrograms(None)``, e.g. when :mod:`foldax.fold` is used as a
library) the programs are plain ``jax.jit`` functions kept in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np

__all__ = ["Request", "fold_batch", "FoldPrograms", "cache_dir", "program_key", "num_chunks_for"]

#: Bump when the layout of the cache directory or of the programs' outputs changes.
CACHE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Request:
    """What one program computes (static: a new value is a new program).

    ``decoder``: ``"mfe"`` (the best-scoring structure, the minimum free energy one for
    an energy model) or ``"mea"`` (maximum expected accuracy, from the pair
    probabilities). ``partition``: also ``log_z``. ``probs``: also the ``[B, L, L]``
    pair probabilities. ``centroid``: also RNAfold's centroid structure, its distance
    and its score (energy models with ``-p``). ``energy``: the parameters are Turner
    energy tables; also the free energies of the structures (:func:`fold_batch`).
    ``min_hairpin``, ``no_lonely_pairs`` and ``num_chunks`` (None: automatic): as in
    :mod:`foldax.layers`. ``no_lp_ensemble`` (with ``no_lonely_pairs``): the ensemble that
    log Z and the pair probabilities sum over, ``"rnafold"`` (RNAfold's ``-p --noLP``: only the
    pairs of :func:`foldax.layers.isolated_pairs` left out) or ``"exact"`` (no structure with a
    lonely pair). The MFE structure has no lonely pair either way; the MEA and centroid
    structures, decoded from the pair probabilities as RNAfold's are, may hold some.
    ``mixture`` (MEA only): the weights of a mixture of parameter sets, whose pair probabilities
    are ``SUM_k w_k P_k`` (:func:`foldax.layers.mixture_pair_probs`); ``params`` is then a tuple of
    the sets, and everything but the pair probabilities (log Z, scores, free energies) is the first
    set's. ``samples``: also that many structures drawn from each sequence's ensemble (the one of
    log Z; a mixture's: each sample from one set, chosen by its weight) with their scores, free
    energies and probabilities (:func:`fold_batch`); the program then takes a PRNG key.
    """

    decoder: str = "mfe"
    partition: bool = False
    probs: bool = False
    centroid: bool = False
    energy: bool = False
    min_hairpin: int = 3
    num_chunks: int | None = None
    no_lonely_pairs: bool = False
    no_lp_ensemble: str = "rnafold"
    mixture: tuple[float, ...] = ()
    samples: int = 0

    def __post_init__(self):
        if self.decoder not in ("mfe", "mea"):
            raise ValueError(f"decoder must be 'mfe' or 'mea', got {self.decoder!r}")
        if self.mixture and self.decoder != "mea":
            raise ValueError("a mixture of parameter sets is decoded by MEA (decoder='mea'): it has no single "
                             "best-scoring structure")
        if self.no_lp_ensemble not in ("rnafold", "exact"):
            raise ValueError(f"no_lp_ensemble must be 'rnafold' or 'exact', got {self.no_lp_ensemble!r}")
        if not isinstance(self.samples, int) or self.samples < 0:
            raise ValueError(f"samples must be a non-negative int, got {self.samples!r}")

    @property
    def exact_no_lp_ensemble(self) -> bool:
        """The log-semiring passes run the grammar without lonely pairs (else, with
        ``no_lonely_pairs``, the default grammar with the isolated pairs forbidden)."""
        return self.no_lonely_pairs and self.no_lp_ensemble == "exact"

    @property
    def needs_probs(self) -> bool:
        return self.decoder == "mea" or self.probs or self.centroid


#: Batches of one sequence up to this length run the DP as one chunk of diagonals (see
#: :func:`num_chunks_for`).
ONE_CHUNK_MAX_LENGTH = 512


def num_chunks_for(batch: int, length: int) -> int | None:
    """Chunks of diagonals (:func:`foldax.layers.chart.diagonal_chunks`) for a ``[batch, length]``
    program: 1 for a single sequence of at most :data:`ONE_CHUNK_MAX_LENGTH`, else automatic (None).

    Each chunk is another loop body to trace and compile, and a single sequence is what a shell loop
    folds: the first call pays the compile, the run is short either way. Turner 2004 MFE of one
    sequence, 1 chunk vs automatic (2026-12-01, with other work on the machine), trace + compile
    and run: 100 nt 3.3 s vs 12.7 s, 87 vs 46 ms; 250 nt 4.4 s vs 23.6 s, 233 vs 152 ms; 500 nt
    3.9 s vs 53 s, 1.46 vs 0.58 s. A batch of several sequences is about throughput and keeps the
    automatic count.
    """
    return 1 if batch == 1 and length <= ONE_CHUNK_MAX_LENGTH else None


def decode_method(request) -> str:
    """How a program reads its MFE or MEA structure off the charts (``layers.decoding.METHODS``).

    A batch traces back cell by cell (``"traceback"``): `foldax fold -i` on 1,000 sequences of
    100-300 nt took 67 s against 102 s with the outside pass (BENCHMARKS.md, "Command line"). A
    single sequence's one-chunk program (:func:`num_chunks_for`) keeps the outside pass: the
    traceback's loop costs that first call about 2.5 s more to compile (`foldax fold` on one
    100-nt sequence, empty program cache, alternating: 7.1-7.9 s against 10.0-10.2 s, 2026-12-07),
    and the run is short either way.
    """
    return "outside" if request.num_chunks == 1 else "traceback"


def _valid_square(lengths, length):
    import jax.numpy as jnp

    valid = jnp.arange(length)[None, :] < lengths[:, None]
    return valid[:, :, None] & valid[:, None, :]


def _value_and_pair_gradient(value_fn, params, tokens, lengths, phi, request, no_lonely_pairs):
    """``(value [B], d value / d phi)`` symmetrised and masked to the sequences: for ``log_partition``
    (``log Z``, the pair probabilities)."""
    import jax
    import jax.numpy as jnp

    def total(f):
        values = value_fn(params, tokens, lengths, phi=f, min_hairpin=request.min_hairpin,
                          num_chunks=request.num_chunks, no_lonely_pairs=no_lonely_pairs)
        return jnp.sum(values), values

    (_, values), grad = jax.value_and_grad(total, has_aux=True)(phi)
    matrix = grad + jnp.swapaxes(grad, 1, 2)
    return values, jnp.where(_valid_square(lengths, tokens.shape[1]), matrix, 0)


def _table_of(matrix, lengths, threshold):
    """Pair table [B, L] (partner or -1) of the pairs whose entry exceeds ``threshold`` (at most one
    per row: an indicator, or probabilities above 1/2)."""
    import jax.numpy as jnp

    paired = (jnp.max(matrix, axis=2) > threshold) & (jnp.arange(matrix.shape[1])[None, :] < lengths[:, None])
    return jnp.where(paired, jnp.argmax(matrix, axis=2), -1).astype(jnp.int32)


def fold_batch(params, tokens, lengths, phi, gamma, key=None, *, request: Request) -> dict:
    """Everything printed for a batch ``tokens [B, L]`` (traced; see the module docstring).

    Returns a dict: ``structure [B, L]`` (int32, -1 unpaired or padding) and ``score [B]``
    (its log-weight, :func:`foldax.layers.structure_score`); with ``partition`` ``log_z [B]``;
    with ``probs`` ``probs [B, L, L]``; with ``centroid`` ``centroid [B, L]``,
    ``centroid_score [B]`` and ``centroid_distance [B]`` (the expected base-pair distance
    of the centroid to the ensemble, RNAfold's ``d``). With ``energy`` (Turner
    parameters) also the free energies (kcal/mol, :func:`foldax.layers.free_energy`, RNAfold's
    ``eval_structure``) of the structures not found by the max semiring: ``energy [B]``
    for the MEA structure, ``centroid_energy [B]``. With ``request.mixture``, ``params`` is a tuple of
    parameter sets and ``probs`` (and the MEA and centroid structures) are their mixture's.
    With ``request.samples`` (and ``key``, a PRNG key's ``uint32`` data) also :func:`_samples`'
    ``samples [B, S, L]``, ``sample_score [B, S]``, ``sample_log_prob [B, S]`` (and ``sample_energy``).
    """
    import jax
    import jax.numpy as jnp

    from foldax import layers

    h, chunks = request.min_hairpin, request.num_chunks
    params, *others = params if request.mixture else (params,)
    dtype = jnp.result_type(*jax.tree.leaves(params))
    pair_phi = jnp.zeros(tokens.shape + tokens.shape[-1:], dtype) if phi is None else phi.astype(dtype)
    out = {}
    # The ensemble of log Z and the pair probabilities (see Request.no_lp_ensemble).
    ensemble_phi = pair_phi
    if request.no_lonely_pairs and not request.exact_no_lp_ensemble:
        isolated = layers.isolated_pairs(tokens, lengths, min_hairpin=h)
        ensemble_phi = jnp.where(isolated, jnp.asarray(layers.FORBIDDEN_PHI, dtype), pair_phi)
    exact = request.exact_no_lp_ensemble
    log_zs = [None] * (1 + len(others))  # each set's, where a pass computes it
    if request.needs_probs:
        log_zs[0], probs = _value_and_pair_gradient(layers.log_partition, params, tokens, lengths, ensemble_phi,
                                                    request, exact)
        if request.mixture:  # (the inside + outside passes of mixture_pair_probs)
            probs = request.mixture[0] * probs
            for k, (weight, member) in enumerate(zip(request.mixture[1:], others), start=1):
                log_zs[k], member_probs = _value_and_pair_gradient(layers.log_partition, member, tokens, lengths,
                                                                   ensemble_phi, request, exact)
                probs = probs + weight * member_probs
        if request.partition:
            out["log_z"] = log_zs[0]
        if request.probs:
            out["probs"] = probs
    elif request.partition:  # log Z alone: no outside pass
        out["log_z"] = log_zs[0] = layers.log_partition(params, tokens, lengths, phi=ensemble_phi, min_hairpin=h,
                                                        num_chunks=chunks, no_lonely_pairs=exact)
    if request.samples:
        if key is None:
            raise ValueError("a request with samples needs a PRNG key")
        out.update(_samples((params, *others), log_zs, tokens, lengths, pair_phi, ensemble_phi,
                            jax.random.wrap_key_data(key), request))
    if request.decoder == "mfe":
        out["structure"], out["score"] = layers.best_structure(params, tokens, lengths, phi=pair_phi, min_hairpin=h,
                                                               num_chunks=chunks, no_lonely_pairs=request.no_lonely_pairs,
                                                               with_score=True, method=decode_method(request))
    else:
        out["structure"] = layers.mea_structure(probs, lengths, gamma=gamma, min_hairpin=h, num_chunks=chunks,
                                                method=decode_method(request))
        out.update(_values(params, tokens, out["structure"], lengths, phi, request, "score", "energy"))
    if request.centroid:
        upper = jnp.triu(probs, 1)
        out["centroid"] = _table_of(probs, lengths, 0.5)
        out.update(_values(params, tokens, out["centroid"], lengths, phi, request, "centroid_score",
                           "centroid_energy"))
        chosen = (jnp.arange(tokens.shape[1])[None, None, :] == out["centroid"][:, :, None]) & (upper > 0.5)
        out["centroid_distance"] = jnp.sum(jnp.where(chosen, 1 - upper, upper), axis=(1, 2))
    return out


def _samples(sets, log_zs, tokens, lengths, score_phi, ensemble_phi, key, request) -> dict:
    """``request.samples`` structures per sequence from the ensemble of log Z (``ensemble_phi``):
    :func:`foldax.layers.sample_structures` of the one parameter set, or of a mixture's sets with
    each sample's set drawn by the mixture's weights (every set samples them all; a categorical
    draw keeps one per sample).

    Returns ``samples [B, S, L]``; ``sample_score [B, S]``, the first set's score with ``score_phi``
    (the value printed for the decoded structure too); ``sample_log_prob [B, S]``, the log
    probability of each sample in the sampled ensemble (a mixture: ``log SUM_k w_k p_k(s)``); with
    ``request.energy`` ``sample_energy [B, S]`` (:func:`foldax.layers.free_energy`, RNAfold's
    ``eval_structure``). ``log_zs``: each set's log Z under ``ensemble_phi``, or None where not yet
    computed.
    """
    import jax
    import jax.numpy as jnp

    from foldax import layers
    from foldax.layers.inside import pair_phi

    count, h, exact = request.samples, request.min_hairpin, request.exact_no_lp_ensemble
    batch, length = tokens.shape
    keys = jax.random.split(key, len(sets) + 1)
    drawn = jnp.stack([layers.sample_structures(k, p, tokens, count, lengths, phi=ensemble_phi, min_hairpin=h,
                                                num_chunks=request.num_chunks, no_lonely_pairs=exact)
                       for k, p in zip(keys, sets)])  # [K, B, S, L]
    if len(sets) == 1:
        tables = drawn[0]
    else:
        choice = jax.random.categorical(keys[-1], jnp.log(jnp.asarray(request.mixture)), shape=(batch, count))
        tables = jnp.take_along_axis(drawn, choice[None, :, :, None], axis=0)[0]
    rows = (jnp.repeat(tokens, count, axis=0), tables.reshape(batch * count, length),
            jnp.repeat(lengths, count, axis=0))
    # Scores without phi, then phi's pairs added (no [B * S, L, L] copy of phi).
    plain = [_each_structure(lambda x, s, n, p=p: layers.structure_score(p, x, s, n, min_hairpin=h), *rows)
             .reshape(batch, count) for p in sets]
    ensemble_pairs = pair_phi(ensemble_phi, tables)
    log_probs = []
    for p, score, log_z in zip(sets, plain, log_zs):
        if log_z is None:
            log_z = layers.log_partition(p, tokens, lengths, phi=ensemble_phi, min_hairpin=h,
                                         num_chunks=request.num_chunks, no_lonely_pairs=exact)
        log_probs.append(score + ensemble_pairs - log_z[:, None])
    if len(sets) == 1:
        log_prob = log_probs[0]
    else:
        weights = jnp.log(jnp.asarray(request.mixture, log_probs[0].dtype))
        log_prob = jax.nn.logsumexp(jnp.stack(log_probs) + weights[:, None, None], axis=0)
    out = {"samples": tables, "sample_score": plain[0] + pair_phi(score_phi, tables), "sample_log_prob": log_prob}
    if request.energy:
        out["sample_energy"] = _each_structure(functools.partial(layers.free_energy, sets[0]), *rows).reshape(
            batch, count)
    return out


#: Sampled structures scored at a time: each holds ~100 KB of temporaries at 512 nt.
SCORE_CHUNK = 1024


def _each_structure(fn, tokens, tables, lengths):
    """``fn(tokens [N, L], tables [N, L], lengths [N]) -> [N]``, :data:`SCORE_CHUNK` rows at a time (a
    loop, so that many samples need bounded memory)."""
    import jax
    import jax.numpy as jnp

    n = tables.shape[0]
    if n <= SCORE_CHUNK:
        return fn(tokens, tables, lengths)
    pad = -n % SCORE_CHUNK

    def chunks(x, fill):  # rows of padding: open chains of length 0
        x = jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1), constant_values=fill)
        return x.reshape((-1, SCORE_CHUNK) + x.shape[1:])

    out = jax.lax.map(lambda c: fn(*c), (chunks(tokens, 0), chunks(tables, -1), chunks(lengths, 0)))
    return out.reshape(-1)[:n]


def _values(params, tokens, table, lengths, phi, request, score_name, energy_name) -> dict:
    """The log-weight of the structures ``table`` and, for Turner parameters, their free energy."""
    from foldax import layers

    out = {score_name: layers.structure_score(params, tokens, table, lengths, phi=phi, min_hairpin=request.min_hairpin)}
    if request.energy:
        out[energy_name] = layers.free_energy(params, tokens, table, lengths)
    return out


# --------------------------------------------------------------------------- #
# the cache directory
# --------------------------------------------------------------------------- #


def cache_dir(environ=None) -> Path | None:
    """Where ``foldax fold`` keeps programs: ``$FOLDAX_CACHE_DIR`` (empty: no cache), else
    ``$XDG_CACHE_HOME/foldax`` or ``~/.cache/foldax``. None when disabled or not creatable."""
    environ = os.environ if environ is None else environ
    if "FOLDAX_CACHE_DIR" in environ:
        chosen = environ["FOLDAX_CACHE_DIR"].strip()
        if not chosen:
            return None
        path = Path(chosen).expanduser()
    else:
        base = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "foldax"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)  # private: a saved program is code that runs
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """SHA-256 of the source of :mod:`foldax.layers` and of this module: programs depend on both."""
    from foldax import layers

    digest = hashlib.sha256()
    files = sorted(Path(layers.__file__).parent.glob("*.py")) + [Path(__file__)]
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """The CPU (model and instruction-set flags): a compiled CPU program may use any of them."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            info = fh.read().split("\n\n", 1)[0]
        wanted = [line for line in info.splitlines() if line.split(":")[0].strip() in ("model name", "flags")]
    except OSError:
        wanted = []
    return " ".join([platform.machine(), platform.processor(), *wanted])


def _spec(x):
    return None if x is None else (tuple(np.shape(x)), str(np.result_type(x)))


def program_key(request: Request, args: tuple, devices: int) -> str:
    """The file name of a program: a hash of what the traced program depends on (see the module
    docstring). ``args = (params, tokens, lengths, phi, gamma, key)``."""
    import jax
    import jaxlib

    params, *rest = args
    leaves, tree = jax.tree.flatten(params)
    device = jax.local_devices()[0]
    parts = [
        f"format {CACHE_FORMAT}", repr(request), str(tree), repr([_spec(leaf) for leaf in leaves]),
        repr([_spec(a) for a in rest]), f"devices {devices} of {jax.local_device_count()} {device.platform} "
        f"{device.device_kind} {device.client.platform_version}", _machine(), f"x64 {jax.config.jax_enable_x64}",
        f"jax {jax.__version__} jaxlib {jaxlib.__version__}", _source_digest(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------- #
# programs
# --------------------------------------------------------------------------- #


class FoldPrograms:
    """Runs :func:`fold_batch`, keeping each compiled program: in memory, and in ``directory`` (see
    the module docstring) when one is given. ``stats`` counts where programs came from: ``memory``,
    ``disk`` (loaded), ``compiled`` (traced and compiled here) and ``released`` (programs given back
    because the process ran short of memory mappings: :mod:`foldax.layers.compiled`); ``notice(shape)``
    is called before a program for tokens of that shape is compiled."""

    def __init__(self, directory: str | os.PathLike | None = None, *, notice=None):
        self.directory = None if directory is None else Path(directory) / "programs"
        self.notice = notice
        if self.directory is not None:
            _listen_to_jax_cache()
        self._programs: dict = {}
        self.stats: Counter = Counter()

    def __call__(self, request: Request, params, tokens, lengths, phi=None, gamma=1.0, key=None) -> dict:
        """:func:`fold_batch` of numpy inputs; numpy outputs. ``key``: a PRNG key's ``uint32`` data
        (``jax.random.key_data``), for a request with samples."""
        import jax

        from foldax.layers.compiled import crowded, release_compiled_programs

        dtype = np.result_type(*[np.asarray(leaf).dtype for leaf in jax.tree.leaves(params)])
        args = (params, np.asarray(tokens, np.int32), np.asarray(lengths, np.int32),
                None if phi is None else np.asarray(phi), np.asarray(gamma, dtype),
                None if key is None else np.asarray(key, np.uint32))
        mesh = _mesh_for(args[1].shape[0])
        if request.num_chunks is None:  # a caller's explicit choice stands
            request = dataclasses.replace(request, num_chunks=num_chunks_for(*args[1].shape))
        if mesh is not None:
            args = _place(args, mesh)
        name = program_key(request, args, 1 if mesh is None else mesh.size)
        if name in self._programs:
            self.stats["memory"] += 1
            return _numpy(self._programs[name](*args))
        if crowded():  # every program holds memory mappings: give them back before adding one
            self._programs.clear()
            release_compiled_programs()
            self.stats["released"] += 1
        program = self._load(name, mesh)
        if program is not None:
            try:
                out = _numpy(program(*args))
                self._programs[name] = program
                return out
            except jax.errors.JaxRuntimeError as err:  # a saved program that cannot run: make it again
                print(f"foldax: the cached program {self._path(name)} failed ({str(err)[:80]}); compiling it again",
                      file=sys.stderr)
                self._path(name).unlink(missing_ok=True)
        program = self._programs[name] = self._compile(name, request, args, mesh)
        return _numpy(program(*args))

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.xla"

    def _load(self, key: str, mesh):
        import jax

        if self.directory is None:
            return None
        devices = jax.local_devices()[:1] if mesh is None else list(mesh.devices.flat)
        program = _read_program(self._path(key), devices)
        if program is not None:
            self.stats["disk"] += 1
        return program

    def _compile(self, key: str, request: Request, args: tuple, mesh):
        import jax

        if self.notice is not None:
            self.notice(args[1].shape)
        shardings = {} if mesh is None else {"in_shardings": _shardings(args, mesh)}
        hits = _JAX_CACHE_HITS[0]
        compiled = jax.jit(functools.partial(fold_batch, request=request), **shardings).lower(*args).compile()
        self.stats["compiled"] += 1
        if self.directory is not None and _JAX_CACHE_HITS[0] == hits:  # never save what JAX's cache gave
            _write_program(self._path(key), compiled)
        return compiled


def _numpy(outputs: dict) -> dict:
    return {k: np.asarray(v) for k, v in outputs.items()}


_JAX_CACHE_HITS = [0]


def _count_jax_cache_hits(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _JAX_CACHE_HITS[0] += 1


@functools.lru_cache(maxsize=1)
def _listen_to_jax_cache() -> None:
    """Counts JAX persistent-cache hits (a user may have enabled that cache: its programs are not saved)."""
    import jax

    jax.monitoring.register_event_listener(_count_jax_cache_hits)


#: The program cache is pruned to this size, least recently used programs first.
MAX_CACHE_BYTES = 2 << 30


def _read_program(path: Path, devices):
    """The compiled program saved in ``path`` for ``devices``, or None (absent, or unusable: then it is
    compiled again)."""
    import pickle

    from jax.experimental import serialize_executable

    try:
        blob = path.read_bytes()
        os.utime(path)  # its modification time is its last use (see _prune)
    except OSError:
        return None
    try:
        return serialize_executable.deserialize_and_load(*pickle.loads(blob), execution_devices=devices)
    except Exception as err:  # noqa: BLE001 - a damaged cache file is rebuilt, never fatal
        print(f"foldax: removing the unusable cached program {path} ({type(err).__name__}); compiling it again",
              file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def _write_program(path: Path, compiled) -> None:
    """Saves a compiled program through a temporary file (a reader never sees half of one); a cache
    that cannot be written only costs time."""
    import pickle

    from jax.experimental import serialize_executable

    try:
        blob = pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError, TypeError, pickle.PicklingError) as err:
        print(f"foldax: this program cannot be saved ({err}); it will be compiled again next time", file=sys.stderr)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
        _prune(path.parent, MAX_CACHE_BYTES)
    except OSError as err:
        print(f"foldax: cannot write the program cache {path.parent} ({err.strerror}); continuing without it",
              file=sys.stderr)


def _prune(directory: Path, max_bytes: int) -> None:
    """Deletes the least recently used programs until the folder holds at most ``max_bytes``."""
    files = []
    for path in directory.glob("*.xla"):
        try:
            info = path.stat()
        except OSError:  # removed meanwhile by another foldax
            continue
        files.append((info.st_mtime, info.st_size, path))
    files.sort()
    total = sum(size for _, size, _ in files)
    for _, size, path in files[:-1]:  # never the newest
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size


def _mesh_for(batch: int):
    """The mesh to split a batch of ``batch`` rows over (:func:`foldax.layers.devices.split_count`), or None."""
    from foldax.layers import devices

    k = devices.split_count(batch)
    return None if k < 2 else devices.batch_mesh(k)


def _shardings(args, mesh):
    from jax.sharding import NamedSharding, PartitionSpec

    replicated, split = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))
    params, tokens, lengths, phi, gamma, key = args
    return (replicated, split, split, None if phi is None else split, replicated,
            None if key is None else replicated)


def _place(args, mesh):
    import jax

    return tuple(None if a is None else jax.device_put(a, s) for a, s in zip(args, _shardings(args, mesh)))
