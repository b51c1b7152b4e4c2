"""``foldax fold``: reading inputs, batched folding, and RNAfold-style output.

The folding itself is done by :mod:`foldax.layers` (no dynamic programming here), in one
compiled program per batch shape (:func:`foldax.programs.fold_batch`: the best or MEA
structure with its score, log Z, the pair probabilities, the centroid; kept across
runs by :class:`foldax.programs.FoldPrograms`). Records are grouped by their padded
length (:func:`foldax.layers.bucket_length`, :data:`foldax.layers.DEFAULT_BUCKETS`) and each group is
folded in batches (:func:`batches`: several only when a group is bigger than
``batch_size``; a short last batch is padded to a power of two so that only a few
programs ever exist per bucket).

Input (:func:`read_inputs`), in the habits of RNAfold:

* FASTA-like text (a file, or stdin): ``>id`` header lines; the sequence may be
  wrapped over several lines; without any header every line is one sequence (ids
  ``seq1``, ``seq2``, ... numbered over all inputs). A line made only of
  ``.()[]{}<>`` right after a sequence is that record's *reference* structure (so
  ``.dbn`` files work; a score such as ``(-1.20)`` after it is ignored). Blank lines
  and lines starting with ``;`` or ``#`` are skipped.
* with ``constraints=True`` (``foldax fold -C``, as ``RNAfold -C``), the line right after a sequence
  is instead its hard *constraint*, made of ``.x|<>()`` (:mod:`foldax.layers.constraints`).
* ``.bpseq``, ``.ct`` and ``.tsv`` files are read with :mod:`foldax.data.formats` (their
  structures become references).
* sequences given on the command line.

Letters as in :func:`foldax.layers.encode`: ``ACGU``, ``T`` (read as ``U``), ``N`` and the
IUPAC codes, any case; printed upper case with ``T`` as ``U``. A positional argument
that is neither a sequence nor an existing file is reported as such (``no such
file`` when it looks like a path: it holds ``/``, ``\\``, ``.`` or starts with ``~``).

What is folded with is a :class:`FoldModel` (:func:`load_model`): score tensors or
Turner energy tables (:mod:`foldax.parameters`), an optional ``phi`` network (a trained
:class:`foldax.model.models.NeuralPhiModel`), the model's ``min_hairpin``, and the units of its
scores. A score is a natural-log
weight, ``score(s) = log w(s)``. For most models it is a plain score (higher is
better) and is printed as ``score``, with ``log Z`` beside it; a model whose
log-weights are ``-E(s) / kT`` of a free energy declares ``energy_kT = kT``
(kcal/mol), and then structures are printed with their free energy ``E = -kT
score`` and the ensemble with ``-kT log Z``, as RNAfold does.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from foldax import layers
from foldax.layers.constraints import check_constraint
from foldax.layers.dotbracket import StructureError, from_dot_bracket, pairs_from_table, to_dot_bracket
from foldax.layers.inside import check_no_lonely_pairs

#: Formats read with :mod:`foldax.data.formats` (everything else is read as FASTA-like text).
STRUCTURED_EXTENSIONS = {".bpseq": "bpseq", ".ct": "ct", ".tsv": "tsv"}
#: Cells (batch x L x L) one batched call may hold when ``batch_size`` is automatic.
DEFAULT_MAX_CELLS = 1 << 22
DEFAULT_MAX_BATCH = 64
#: The same per device for energy (Turner) parameters: 4 rows at 256 nt, 1 from 363 nt. Larger
#: batches run slower per sequence, as each diagonal's [B, 31, L] interior-loop windows outgrow
#: the cache (64 x 200 nt on 2 devices: 1.3-1.5x the time of calls of 8; BENCHMARKS.md, "Command line").
ENERGY_CELLS_PER_DEVICE = 1 << 18

_STRUCTURE_LINE = re.compile(r"^[.()\[\]{}<>]+$")
_PSEUDOKNOT_LINE = re.compile(r"^[.()\[\]{}<>A-Za-z]+$")
#: With constraints, a line after a sequence holding any of these is its constraint (no sequence
#: letter is one of them), so that a bad symbol is reported as a constraint error.
_CONSTRAINT_MARK = re.compile(r"[.|<>()]")
_SCORE_SUFFIX = re.compile(r"^[(\[{]\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?.*[)\]}]$")


class InputError(ValueError):
    """A bad input record: names the record (id), where it is (``file:line``) and what is wrong."""

    def __init__(self, message: str, *, where: str = "", record: str | None = None):
        self.where, self.record, self.detail = where, record, message
        prefix = f"{where}: " if where else ""
        what = f"record {record!r}: " if record else ""
        super().__init__(f"{prefix}{what}{message}")


@dataclasses.dataclass
class InputRecord:
    """One sequence to fold.

    ``reference`` is a pair table (or None); ``source`` is ``file:line`` of the record's
    first line (or ``argument k`` / ``<stdin>:line``); ``description`` is the rest of a
    FASTA header after the id, echoed in the dbn output as RNAfold does. ``constraint``: a hard
    constraint in RNAfold's notation (:func:`foldax.layers.constraint_phi`), or None.
    """

    id: str
    sequence: str
    reference: np.ndarray | None = None
    source: str = ""
    description: str = ""
    constraint: str | None = None


@dataclasses.dataclass(frozen=True)
class FoldModel:
    """What ``foldax fold`` folds with.

    ``params``: the score tensors or energy tables (anything :mod:`foldax.layers` accepts). ``phi_fn``:
    ``(tokens [B, L], lengths [B]) -> phi [B, L, L]`` extra pair scores (a trained
    neural model's encoder), or None. ``min_hairpin``: the model's own (the default of
    ``--min-hairpin``). ``energy_kT``: None when scores are plain log-scores; ``kT``
    in kcal/mol when a score is the log-weight ``-E / kT`` of a free energy ``E``
    (then energies are printed, RNAfold style). ``description``: where the model came
    from, for messages; ``notes``: things the user should know about that choice.
    ``mea_gamma``: the MEA ``gamma`` of ``--mea`` without ``--gamma`` (a shipped set's own, or a
    training run's ``config.gamma``). ``members``: further parameter sets (of either grammar) whose
    pair probabilities are mixed with ``params``' (:func:`foldax.layers.mixture_pair_probs`, with
    ``weights`` for ``(params, *members)``, default uniform; ``--params A+B`` or a registry mixture
    such as the default); such a model folds by MEA only, and its scores, free energies and log Z
    are ``params``'.

    >>> FoldModel(layers.default_params()).units
    'score'
    >>> FoldModel(layers.default_params(), energy_kT=0.61632).energy(-1.0)
    0.61632
    """

    params: object
    phi_fn: object = None
    min_hairpin: int = 3
    energy_kT: float | None = None
    description: str = "foldax.layers.default_params()"
    notes: tuple[str, ...] = ()
    mea_gamma: float = 1.0
    members: tuple = ()
    weights: tuple[float, ...] = ()

    @property
    def mixture(self) -> tuple[float, ...]:
        """The mixture's weights of ``(params, *members)`` (normalised; uniform unless ``weights``),
        or ``()`` for one set."""
        if not self.members:
            return ()
        weights = self.weights or (1.0,) * (1 + len(self.members))
        return tuple(w / sum(weights) for w in weights)

    @property
    def units(self) -> str:
        """``"kcal/mol"`` for an energy model, else ``"score"``."""
        return "score" if self.energy_kT is None else "kcal/mol"

    def energy(self, score: float) -> float:
        """The free energy ``-kT score`` (kcal/mol) of a log-weight; only for energy models."""
        if self.energy_kT is None:
            raise ValueError(f"{self.description}: its scores are not energies (no energy_kT)")
        return -self.energy_kT * score


@dataclasses.dataclass
class FoldResult:
    """The fold of one record. ``probs`` is a symmetric ``[n, n]`` matrix (or None).

    ``score`` and ``log_z`` are natural-log weights; ``energy_kT`` (from the
    :class:`FoldModel`) says whether they are to be printed as free energies.
    """

    record: InputRecord
    structure: np.ndarray
    score: float
    log_z: float | None = None
    probs: np.ndarray | None = None
    energy_kT: float | None = None
    #: ``-p`` with an energy model: RNAfold's centroid structure (pairs with probability > 1/2),
    #: its free energy (kcal/mol) and its expected base-pair distance to the ensemble.
    centroid: np.ndarray | None = None
    centroid_energy: float | None = None
    centroid_distance: float | None = None
    #: How the structure was chosen: ``"mfe"`` (best-scoring) or ``"mea"``.
    decoder: str = "mfe"
    #: The structure's free energy when it is not ``-kT score`` (Turner parameters: RNAfold's
    #: ``eval_structure``, which rounds large hairpins as the partition function does not).
    evaluated_energy: float | None = None
    #: ``samples=S``: pair tables ``[S, n]`` drawn from the ensemble, each one's score (as
    #: :attr:`score`), free energy (energy models, as :attr:`evaluated_energy`) and log probability in
    #: the ensemble it was drawn from.
    samples: np.ndarray | None = None
    sample_scores: np.ndarray | None = None
    sample_energies: np.ndarray | None = None
    sample_log_probs: np.ndarray | None = None

    @property
    def is_energy(self) -> bool:
        return self.energy_kT is not None

    @property
    def energy(self) -> float | None:
        """Free energy of the structure (kcal/mol) for an energy model: ``-kT score``, or
        :attr:`evaluated_energy` when known."""
        if self.energy_kT is None:
            return None
        return _free_energy(self.energy_kT, self.score, self.evaluated_energy)

    @property
    def ensemble_energy(self) -> float | None:
        """Ensemble free energy ``-kT log Z`` (kcal/mol), for an energy model with log Z."""
        return None if self.energy_kT is None or self.log_z is None else -self.energy_kT * self.log_z

    @property
    def dot_bracket(self) -> str:
        return to_dot_bracket(self.structure)

    @property
    def probability(self) -> float | None:
        """``p(structure | sequence) = exp(score - log Z)``."""
        return None if self.log_z is None else math.exp(min(self.score - self.log_z, 0.0))


# --------------------------------------------------------------------------- #
# input
# --------------------------------------------------------------------------- #


class _Pending:
    """A record being assembled from text lines."""

    def __init__(self, rid, start, where_name, header, description=""):
        self.id, self.start, self.name, self.header = rid, start, where_name, header
        self.description = description
        self.chunks: list[tuple[int, str]] = []  # (line, text)
        self.structure: tuple[int, str] | None = None

    @property
    def where(self) -> str:
        return f"{self.name}:{self.start}"


def _check_sequence(raw: str, *, where: str, record: str | None, line_of=None) -> str:
    """Validates with :func:`foldax.layers.encode`; returns the normalised sequence.

    ``line_of(pos)`` maps a 0-based position to ``file:line`` for wrapped FASTA.
    """
    if not raw:
        raise InputError("empty sequence", where=where, record=record)
    try:
        layers.encode(raw)
    except ValueError as err:
        message = str(err)
        match = re.search(r"at position (\d+)", message)
        if match:
            pos = int(match.group(1))
            message = message.replace(match.group(0), f"at position {pos + 1} (1-based)")
            if line_of is not None:
                where = line_of(pos)
        raise InputError(message, where=where, record=record) from None
    return raw.upper().replace("T", "U")


def _finish(p: _Pending, auto_id, constraints: bool = False) -> InputRecord:
    rid = p.id or auto_id()
    seq_raw = "".join(text for _, text in p.chunks)

    def line_of(pos):
        for line, text in p.chunks:
            if pos < len(text):
                return f"{p.name}:{line}"
            pos -= len(text)
        return p.where

    where = f"{p.name}:{p.chunks[0][0]}" if p.chunks else p.where
    if not p.chunks:
        raise InputError("no sequence after the header", where=p.where, record=rid)
    seq = _check_sequence(seq_raw, where=where, record=rid, line_of=line_of)
    reference = None
    if p.structure is not None and constraints:
        line, text = p.structure
        try:
            check_constraint(text, seq)
        except ValueError as err:
            raise InputError(str(err), where=f"{p.name}:{line}", record=rid) from None
        return InputRecord(rid, seq, None, p.where, p.description, constraint=text)
    if p.structure is not None:
        line, text = p.structure
        if len(text) != len(seq):
            raise InputError(f"structure has length {len(text)} but the sequence has {len(seq)}",
                             where=f"{p.name}:{line}", record=rid)
        try:
            reference = from_dot_bracket(text, allow_pseudoknots=True)
        except StructureError as err:
            message = re.sub(r"at position (\d+)", lambda m: f"at position {int(m.group(1)) + 1} (1-based)",
                             str(err))
            raise InputError(f"bad structure: {message}", where=f"{p.name}:{line}", record=rid) from None
    return InputRecord(rid, seq, reference, p.where, p.description)


def _is_structure(word: str, current: _Pending, constraints: bool = False) -> bool:
    """A dot-bracket line: only ``.()[]{}<>``, or (pseudoknot letters ``Aa``..) brackets and
    letters with exactly the length of the sequence read so far; with ``constraints``, any line
    holding one of ``.|<>()``, or only ``x`` of that length (a constraint, checked by
    :func:`foldax.layers.constraint_phi`)."""
    read = sum(len(text) for _, text in current.chunks)
    if _STRUCTURE_LINE.match(word) or (constraints and _CONSTRAINT_MARK.search(word)):
        return True
    if constraints and set(word) == {"x"} and len(word) == read:  # all unpaired
        return True
    return (_PSEUDOKNOT_LINE.match(word) is not None and any(c in word for c in ".()[]{}<>")
            and len(word) == read)


def parse_text(text: str, name: str, auto_id, *, constraints: bool = False) -> list[InputRecord | InputError]:
    """Parses FASTA-like / dot-bracket text (see the module docstring).

    Returns records and :class:`InputError` items (one per bad record) in input order.
    ``auto_id()`` gives the id of a record without a header. ``constraints``: the line after a
    sequence is its hard constraint, not a reference structure.
    """
    out: list[InputRecord | InputError] = []
    current: _Pending | None = None

    def flush():
        nonlocal current
        if current is not None:
            try:
                out.append(_finish(current, auto_id, constraints))
            except InputError as err:
                out.append(err)
        current = None

    for line, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped[0] in ";#":
            continue
        if stripped.startswith(">"):
            flush()
            words = stripped[1:].split(None, 1)
            current = _Pending(words[0] if words else None, line, name, header=True,
                               description=words[1].strip() if len(words) > 1 else "")
            continue
        first, *rest = stripped.split(None, 1)
        if (current is not None and current.chunks and current.structure is None
                and _is_structure(first, current, constraints)):
            if rest and not _SCORE_SUFFIX.match(rest[0].strip()):
                current.structure = (line, stripped)  # reported as a bad structure
            else:
                current.structure = (line, first)
            continue
        if current is None or not current.header or current.structure is not None:
            flush()
            current = _Pending(None, line, name, header=False)
        current.chunks.append((line, stripped))  # without headers: one sequence per line
    flush()
    return out


def _read_structured(path: str, fmt: str) -> list[InputRecord | InputError]:
    from foldax.data import formats

    report = formats.LoadReport()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as err:
        return [InputError(f"cannot read: {err.strerror}", where=path)]
    records = formats.parse_records(text, fmt, name=path, strict=False, pseudoknots="keep", report=report)
    # parse_records keeps the order of good records; bad ones are only in report.errors.
    out: list[InputRecord | InputError] = [InputError(message) for message in report.errors]
    for r in records:
        try:
            seq = _check_sequence(r.sequence, where=r.source, record=r.id)
        except InputError as err:
            out.append(err)
            continue
        out.append(InputRecord(r.id, seq, np.asarray(r.pair_table), r.source))
    return out


def looks_like_path(arg: str) -> bool:
    """Whether a command-line argument can only be a file name: sequences are letters only.

    >>> [looks_like_path(a) for a in ("ACGU", "seqs.fa", "data/x", "~/x", "acgu ")]
    [False, True, True, True, False]
    """
    text = arg.strip()
    return any(c in text for c in "/\\.") or text.startswith("~")


def read_inputs(sequences: Sequence[str] = (), input_path: str | None = None, stdin=None, *,
                constraints: bool = False) -> list[InputRecord | InputError]:
    """All records to fold, in order: positional arguments, then ``input_path``.

    A positional argument naming an existing file is read as a file; one that
    :func:`looks_like_path` but does not exist is a "no such file" error; any other is
    a sequence. ``input_path`` ``"-"`` (or no input at all) reads ``stdin``. ``constraints``: in
    FASTA-like text the line after a sequence is its hard constraint (``foldax fold -C``).
    """
    counter = iter(range(1, 1 << 62))

    def auto_id():
        return f"seq{next(counter)}"

    items: list[InputRecord | InputError] = []
    for k, arg in enumerate(sequences, start=1):
        if os.path.isfile(arg):
            items.extend(_read_file(arg, auto_id, constraints))
            continue
        if os.path.isdir(arg):
            items.append(InputError(f"{arg!r} is a directory, not a sequence file", where=f"argument {k}"))
            continue
        if looks_like_path(arg):
            items.append(InputError(f"no such file: {arg!r} (an argument with '/', '.' or '~' is read as a "
                                    f"file path, never as a sequence)", where=f"argument {k}"))
            continue
        rid = auto_id()
        try:
            items.append(InputRecord(rid, _check_sequence(arg.strip(), where=f"argument {k}", record=rid),
                                     source=f"argument {k}"))
        except InputError as err:
            items.append(InputError(f"{err.detail}; and there is no file named {arg!r}", where=err.where,
                                    record=err.record))
    if input_path == "-" or (input_path is None and not sequences):
        if stdin is None:
            import sys

            stdin = sys.stdin
        items.extend(parse_text(stdin.read(), "<stdin>", auto_id, constraints=constraints))
    elif input_path is not None:
        items.extend(_read_file(input_path, auto_id, constraints))
    return items


def _read_file(path: str, auto_id, constraints: bool = False) -> list[InputRecord | InputError]:
    ext = os.path.splitext(path)[1].lower()
    if ext in STRUCTURED_EXTENSIONS:
        return _read_structured(path, STRUCTURED_EXTENSIONS[ext])
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as err:
        return [InputError(f"cannot read: {err.strerror}", where=path)]
    return parse_text(text, path, auto_id, constraints=constraints)


# --------------------------------------------------------------------------- #
# parameters
# --------------------------------------------------------------------------- #


CHECKPOINTS = ("best", "latest")
#: One parameter set where one is needed and none is named (:func:`load_params`).
MEMBER_DEFAULT = "turner2004"


def load_params(path: str | None):
    """Parameters from a registry name or a file (:func:`foldax.parameters.load`; None: Turner 2004,
    the first member of :data:`foldax.parameters.DEFAULT`). For a training workdir or a mixture use
    :func:`load_model`."""
    from foldax import parameters

    return parameters.load(MEMBER_DEFAULT if path is None else path)[0]


def is_training_workdir(path: str) -> bool:
    """A ``foldax train`` workdir: a directory with ``config.json`` or ``checkpoints/``."""
    return os.path.isdir(path) and (os.path.isfile(os.path.join(path, "config.json"))
                                    or os.path.isdir(os.path.join(path, "checkpoints")))


def load_model(path: str | None, *, checkpoint: str = "best", temperature: float = 37.0) -> FoldModel:
    """The :class:`FoldModel` of ``--params PATH``.

    * None: :data:`foldax.parameters.DEFAULT` (a shipped parameter set).
    * a shipped name (``turner2004``, ``stacking``, ``handset``; see
      :mod:`foldax.parameters`) or a parameter file (``.par``, ``.json``, ``.npz``): its
      parameters; energy tables fold as an energy model (RNAfold's kcal/mol).
    * a training workdir: its ``checkpoint`` (``"best"`` by the validation metric, or
      ``"latest"``) restored as the whole trained model -- a neural model keeps its
      ``phi`` network -- with the run's ``min_hairpin``. A ``params.npz`` there is
      not used (it may be older than the checkpoints); a note says so.
    * another directory with a ``params.npz``: that file (a note says so).
    * a registry mixture (:func:`foldax.parameters.mixtures`; the default
      ``turner2004+turner1999+stacking``): its members, weights and MEA gamma, with its provenance.
    * ``A+B[+...]`` (not an existing path): a mixture of shipped sets or parameter files of either
      grammar, their pair probabilities averaged (:attr:`FoldModel.members`); it folds by MEA
      at ``A``'s gamma, and its energies are ``A``'s.

    ``temperature`` (degrees Celsius, ``RNAfold -T``): energy parameter sets rescaled to it
    (:func:`foldax.layers.load_params`); a stacking set or a training workdir has none (ValueError).

    The first note always says which parameters are used and where they came from.
    """
    from foldax import parameters

    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}")
    spec = parameters.DEFAULT if path is None else path
    if spec in parameters.mixtures() and not os.path.exists(spec):
        entry = parameters.mixtures()[spec]
        return _mixture_model(spec, entry["members"], weights=entry["weights"], summary=entry["summary"],
                              mea_gamma=float(entry["mea_gamma"]["value"]), temperature=temperature)
    if "+" in spec and not os.path.exists(spec):
        return _mixture_model(spec, spec.split("+"), temperature=temperature)
    if os.path.isdir(spec) and float(temperature) != 37.0:
        raise ValueError(f"--params {spec}: a directory; a temperature other than 37 C needs an energy parameter "
                         f"file (for a training run: 'foldax export-params --workdir {spec} --out FILE.npz')")
    if os.path.isdir(spec):
        exported = os.path.join(spec, "params.npz")
        if is_training_workdir(spec):
            has_checkpoint = any(name.isdigit() for name in _listdir(os.path.join(spec, "checkpoints")))
            if has_checkpoint or not os.path.isfile(exported):
                return _restore_workdir(spec, checkpoint, exported)
            note = f"{spec} has no checkpoint yet: folding with {exported}"
        elif os.path.isfile(exported):
            note = f"using {exported}"
        else:
            raise FileNotFoundError(f"--params {spec}: a directory that is neither a training workdir (no "
                                    f"config.json or checkpoints/) nor holds a params.npz")
        return _model_of(*parameters.load(exported), notes=(note,))
    return _model_of(*parameters.load(spec, temperature=temperature))


def _energy_kT(params) -> float | None:
    """kT (kcal/mol) of energy parameters' log-weights (their temperature's), None for scores."""
    return float(layers.energy_params.temperature_kt(params)) if layers.is_energy_params(params) else None


def _model_of(params, provenance, *, notes=()) -> FoldModel:
    """A :class:`FoldModel` of loaded parameters: energy tables fold as an energy model."""
    energy_kT = _energy_kT(params)
    return FoldModel(params, energy_kT=energy_kT, description=provenance.line(), mea_gamma=provenance.mea_gamma,
                     notes=(f"parameters: {provenance.line()}", *notes))


def _mixture_model(spec: str, names, *, weights=None, summary=None, mea_gamma=None,
                   temperature: float = 37.0) -> FoldModel:
    """The :class:`FoldModel` of a mixture: ``names`` are shipped names or parameter files (of either
    grammar: pair probabilities are comparable across grammars); ``weights`` default to uniform, the
    MEA gamma to the first member's, whose energies or scores are printed."""
    from foldax import parameters

    if len(names) < 2 or not all(names):
        raise ValueError(f"--params {spec}: a mixture is two or more parameter sets joined by '+' (e.g. "
                         f"turner2004+turner1999)")
    loaded = []
    for name in names:
        if os.path.isdir(name):
            raise ValueError(f"--params {spec}: {name} is a directory; a mixture takes shipped names and "
                             f"parameter files")
        loaded.append(parameters.load(name, temperature=temperature))
    (first, about), rest = loaded[0], loaded[1:]
    weights = tuple(float(w) for w in (weights or (1.0,) * len(names)))
    gamma = about.mea_gamma if mea_gamma is None else mea_gamma
    shares = ", ".join(f"{n} {w / sum(weights):.3g}" for n, w in zip(names, weights))
    what = summary or (f"a mixture of {', '.join(names)}: the MEA structure of the mean of their pair "
                       f"probabilities; energies, scores and the ensemble free energy are {names[0]}'s")
    notes = [f"parameters: {spec}: {what} (weights: {shares})"]
    notes += [f"  {a.line()}" for _, a in loaded]
    return FoldModel(first, energy_kT=_energy_kT(first),
                     description=f"--params {spec}", mea_gamma=gamma, notes=tuple(notes),
                     members=tuple(p for p, _ in rest), weights=weights)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _restore_workdir(workdir: str, which: str, exported: str) -> FoldModel:
    """The ``which`` checkpoint of a training workdir as a :class:`FoldModel` (the whole model)."""
    try:
        import jax
        from flax import nnx

        from foldax.train import train as trainer
        from foldax.train.main import quiet_orbax
    except ImportError as err:
        raise ValueError(f"--params {workdir}: a training workdir, but the training package is not available "
                         f"to restore it ({err})") from None
    restore = trainer.restore_for_inference
    try:
        with quiet_orbax():
            config, _mesh, manager, graphdef, state, step = restore(workdir, which)
            steps = sorted(manager.all_steps())
            metrics = manager.metrics(step) if hasattr(manager, "metrics") else None
            manager.close()
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--params {workdir}: {err} (train a model first, or pass an .npz)") from None
    except Exception as err:  # noqa: BLE001 - any failure to restore is reported the same way
        raise ValueError(f"--params {workdir}: cannot restore its {which} checkpoint: {err}") from None
    model = nnx.merge(graphdef, jax.device_get(state))
    model = model[0] if isinstance(model, tuple) else model  # (model, optimizer) of a training state
    return _fold_model_of(model, workdir=workdir, which=which, step=step, steps=steps, metrics=metrics,
                          best_metric=config.get("best_metric", ""), exported=exported,
                          min_hairpin=int(config.model.get("min_hairpin", 3)),
                          mea_gamma=float(config.get("gamma", 1.0)))


def _fold_model_of(model, *, workdir, which, step, steps, metrics, best_metric, exported, min_hairpin,
                   mea_gamma=1.0) -> FoldModel:
    """A restored :mod:`foldax.model.models` model (``scores(tokens, lengths) -> (params, phi)``) for folding."""
    import jax
    from flax import nnx

    probe = np.zeros((1, 8), np.int32)
    params, phi = model.scores(probe, np.array([8], np.int32))
    params = jax.tree.map(np.asarray, params)
    phi_fn = None
    if phi is not None:
        graphdef, state = nnx.split(model)
        phi_fn = jax.jit(lambda tokens, lengths: nnx.merge(graphdef, state).scores(tokens, lengths)[1])
    latest = steps[-1] if steps else step
    what = f"{which} checkpoint, step {step}"
    if which == "best":
        value = (metrics or {}).get(best_metric) if best_metric else None
        what += f" (validation {best_metric} = {value:.4g})" if isinstance(value, (int, float)) else ""
    kind = type(model).__name__ + (" with its phi network" if phi_fn is not None else "")
    notes = [f"--params {workdir}: {kind}, {what}"]
    if latest != step:
        notes.append(f"newer checkpoints exist (latest: step {latest}); use --checkpoint latest to fold with it")
    if os.path.isfile(exported):
        notes.append(f"{exported} is not used (it may be older than the checkpoints); pass the file itself "
                     f"as --params to fold with it")
    return FoldModel(params, phi_fn=phi_fn, min_hairpin=min_hairpin,
                     energy_kT=getattr(model, "energy_kT", None), description=f"{workdir} ({what})",
                     notes=tuple(notes), mea_gamma=mea_gamma)


# --------------------------------------------------------------------------- #
# folding
# --------------------------------------------------------------------------- #


def _auto_batch(width: int, max_cells: int, multiple: int = 1) -> int:
    rows = max_cells // max(width * width, 1)
    return max(1, min(DEFAULT_MAX_BATCH, max(multiple, rows // multiple * multiple)))


def _padded_size(n: int, limit: int) -> int:
    return min(1 << (n - 1).bit_length(), limit) if n < limit else n


def batches(records: Sequence[InputRecord], *, batch_size: int | None = None, max_cells: int = DEFAULT_MAX_CELLS,
            multiple: int = 1) -> list[tuple[list[int], int]]:
    """How :func:`fold_records` groups ``records``: ``(indices, padded batch size)`` per batched call.

    Records are grouped by length bucket (:func:`foldax.layers.bucket_length`), each group cut into
    calls of at most ``batch_size`` (default: as many as fit ``max_cells`` = B x L x L, rounded
    down to a multiple of ``multiple`` (the devices a call is split over) but at least that, at
    most 64), and a short call is padded up to a power of two, so that few programs exist per bucket.

    Example:
      >>> records = [InputRecord(f"s{k}", "ACGU" * 50) for k in range(10)]   # 200 nt: the 256 bucket
      >>> [size for _, size in batches(records, max_cells=ENERGY_CELLS_PER_DEVICE * 2, multiple=2)]
      [8, 2]
    """
    groups: dict[int, list[int]] = defaultdict(list)
    for k, r in enumerate(records):
        groups[layers.bucket_length(len(r.sequence))].append(k)
    out = []
    for width in sorted(groups):
        members = groups[width]
        limit = batch_size or _auto_batch(width, max_cells, multiple)
        for start in range(0, len(members), limit):
            chunk = members[start:start + limit]
            out.append((chunk, _padded_size(len(chunk), limit)))
    return out


def fold_records(model, records: Sequence[InputRecord], *, mea: bool = False, gamma: float | None = None,
                 partition: bool = False, probs: bool = False, min_hairpin: int | None = None,
                 no_lonely_pairs: bool = False, no_lp_ensemble: str = "rnafold", batch_size: int | None = None,
                 max_cells: int | None = None, programs=None, progress=None,
                 enforce_constraints: bool = False, samples: int = 0, key=None) -> list[FoldResult]:
    """Folds ``records`` in length buckets (:func:`batches`); results in input order.

    ``model``: a :class:`FoldModel` (its ``phi_fn``, if any, scores every batch), or
    plain parameters. ``mea``: maximum expected accuracy structure
    (:func:`foldax.layers.mea_structure` with ``gamma``, default the model's ``mea_gamma``) instead
    of the best-scoring one. ``partition``: also log Z (and, for an energy model, RNAfold's centroid structure).
    ``probs``: also keep each record's ``[n, n]`` pair probabilities. ``min_hairpin``:
    default the model's. ``no_lonely_pairs``: RNAfold's ``--noLP`` (energy parameters only): an MFE
    structure without lonely pairs, and log Z and pair probabilities over RNAfold's ensemble
    (``no_lp_ensemble="rnafold"``) or the exact one (``"exact"``; see
    :class:`foldax.programs.Request`). ``batch_size``: at most this many sequences per batched call (default: by
    length, ``max_cells`` cells; that default is :data:`DEFAULT_MAX_CELLS`, or for energy parameters
    :data:`ENERGY_CELLS_PER_DEVICE` per local device, each call a multiple of the device count).
    ``enforce_constraints``: the records' constraints also require their ``( )`` pairs and ``|``
    positions to pair (``RNAfold -C --enforceConstraint``; :func:`foldax.layers.constraint_phi`), and
    scores and log Z are those of the enforced ensemble.
    ``samples``: also draw that many structures from each record's ensemble (the one of log Z: with
    constraints, the constrained one; a mixture's, each sample from one member set chosen by its
    weight), as ``RNAsubopt -p``, drawn with the JAX PRNG ``key`` (default ``jax.random.key(0)``; the
    same records, options and key give the same samples).
    ``programs``: a :class:`foldax.programs.FoldPrograms` (default: a new one, in memory);
    each batch is one call of its compiled program. ``progress(n)``: called with the
    number of records of each batch once it is folded.
    """
    from foldax.programs import FoldPrograms, Request

    if not isinstance(model, FoldModel):
        model = FoldModel(model, energy_kT=_energy_kT(model))
    mea = mea or bool(model.members)  # a mixture has no single best-scoring structure
    programs = FoldPrograms(None) if programs is None else programs
    gamma = model.mea_gamma if gamma is None else gamma
    param_sets = [jax.tree.map(np.asarray, layers.check_params(p)) for p in (model.params, *model.members)]
    for checked in param_sets:  # (every member: a stacking one has no --noLP ensemble)
        no_lonely_pairs = check_no_lonely_pairs(checked, no_lonely_pairs)
    params = tuple(param_sets) if model.members else param_sets[0]
    request = Request(decoder="mea" if mea else "mfe", partition=partition, probs=probs,
                      centroid=model.energy_kT is not None and partition, energy=layers.is_energy_params(model.params),
                      min_hairpin=model.min_hairpin if min_hairpin is None else min_hairpin,
                      no_lonely_pairs=no_lonely_pairs, no_lp_ensemble=no_lp_ensemble, mixture=model.mixture,
                      samples=int(samples))
    results: list[FoldResult | None] = [None] * len(records)
    if samples and key is None:
        key = jax.random.key(0)
    # (the batch is sized for the costlier grammar of a mixture's members)
    energy = any(layers.is_energy_params(p) for p in param_sets)
    multiple = jax.local_device_count() if energy else 1
    if max_cells is None:
        max_cells = ENERGY_CELLS_PER_DEVICE * multiple if energy else DEFAULT_MAX_CELLS
    for call, (chunk, size) in enumerate(batches(records, batch_size=batch_size, max_cells=max_cells,
                                                 multiple=multiple)):
        call_key = jax.random.key_data(jax.random.fold_in(key, call)) if samples else None
        seqs = [records[k].sequence for k in chunk]
        seqs += [seqs[0]] * (size - len(chunk))
        tokens, lengths = layers.encode_batch(seqs)
        phi = None if model.phi_fn is None else np.asarray(model.phi_fn(tokens, lengths))
        constraints = [records[k].constraint for k in chunk]
        phi = _with_constraints(phi, constraints, tokens.shape, enforce=enforce_constraints)
        out = programs(request, params, tokens, lengths, phi=phi, gamma=gamma, key=call_key)
        if enforce_constraints:
            out = _without_bonus(out, constraints)
        for row, k in enumerate(chunk):
            results[k] = _result(records[k], out, row, int(lengths[row]), model.energy_kT, request)
        if progress is not None:
            progress(len(chunk))
    return results  # type: ignore[return-value]


def _with_constraints(phi, constraints, shape, *, enforce: bool = False):
    """``phi`` [B, L, L] (or None) plus the records' hard constraints (None: unconstrained) for a batch of
    ``shape`` (B, L), whose rows past ``constraints`` are padding; ``enforce``: with their bonus."""
    if all(c is None for c in constraints):
        return phi
    batch, width = shape
    forbid = np.zeros((batch, width, width), np.float32)
    for row, constraint in enumerate(constraints):
        if constraint is not None:
            forbid[row] = layers.constraint_phi(constraint, length=width, enforce=enforce)
    return forbid if phi is None else phi + forbid


def _without_bonus(out: dict, constraints) -> dict:
    """A program's outputs with the enforced constraints' bonus taken out of log Z and the scores."""
    from foldax.layers.constraints import enforced_bonus

    out = {name: np.array(value) for name, value in out.items()}
    for row, constraint in enumerate(constraints):
        if constraint is None:
            continue
        n = len(constraint)
        if "log_z" in out:
            out["log_z"][row] -= enforced_bonus(constraint)
        for score, structure in (("score", "structure"), ("centroid_score", "centroid")):
            if score in out:
                out[score][row] -= enforced_bonus(constraint, out[structure][row, :n])
        if "samples" in out:
            out["sample_score"][row] -= [enforced_bonus(constraint, table[:n]) for table in out["samples"][row]]
    return out


def _free_energy(energy_kT: float, score: float, evaluated: float | None) -> float:
    """A structure's free energy (kcal/mol): ``evaluated`` when known, else ``-kT score``.

    ``+ 0.0``: the open chain's ``-kT * 0`` is -0.0, which would print as ``( -0.00)``; RNAfold
    prints ``(  0.00)``."""
    return (-energy_kT * score if evaluated is None else evaluated) + 0.0


def _result(record: InputRecord, out: dict, row: int, n: int, energy_kT, request) -> FoldResult:
    """Row ``row`` of a program's outputs (see :func:`foldax.programs.fold_batch`) as a FoldResult."""

    def value(name):
        return float(out[name][row]) if name in out else None

    p = None
    if "probs" in out:
        upper = np.triu(out["probs"][row, :n, :n].astype(np.float64), 1)
        p = upper + upper.T
    centroid = {}
    if "centroid" in out:
        energy = value("centroid_energy")
        centroid = dict(centroid=out["centroid"][row, :n].copy(), centroid_distance=value("centroid_distance"),
                        centroid_energy=_free_energy(energy_kT, value("centroid_score"), energy))
    drawn = {}
    if "samples" in out:
        drawn = dict(samples=out["samples"][row, :, :n].copy(), sample_scores=out["sample_score"][row].astype(np.float64),
                     sample_log_probs=out["sample_log_prob"][row].astype(np.float64))
        if "sample_energy" in out:
            drawn["sample_energies"] = out["sample_energy"][row].astype(np.float64) + 0.0  # (no -0.00)
    return FoldResult(record, out["structure"][row, :n].copy(), value("score"), value("log_z"), p,
                      energy_kT=energy_kT, decoder=request.decoder, evaluated_energy=value("energy"), **centroid,
                      **drawn)


# --------------------------------------------------------------------------- #
# output
# --------------------------------------------------------------------------- #


def ensemble_string(probs: np.ndarray) -> str:
    """RNAfold's pseudo-bracket summary of pair probabilities, one character a position.

    ``.`` / ``(`` / ``)``: unpaired / paired upstream / downstream with probability > 2/3;
    ``{`` ``}`` ``|``: mostly paired (up, down, either); ``,``: mostly unpaired; ``:`` else.
    """
    n = probs.shape[0]
    up = np.triu(probs, 1).sum(axis=1)  # paired with a partner j > i
    down = np.tril(probs, -1).sum(axis=1)  # paired with a partner j < i
    chars = []
    for i in range(n):
        p_up, p_down = up[i], down[i]
        p_un = max(0.0, 1.0 - p_up - p_down)
        if p_un > 0.667:
            chars.append(".")
        elif p_up > 0.667:
            chars.append("(")
        elif p_down > 0.667:
            chars.append(")")
        elif p_up + p_down > p_un:
            ratio = p_up / (p_up + p_down)
            chars.append("{" if ratio > 0.667 else "}" if ratio < 0.333 else "|")
        elif p_un > p_up + p_down:
            chars.append(",")
        else:
            chars.append(":")
    return "".join(chars)


def ensemble_diversity(probs: np.ndarray) -> float:
    """Mean base-pair distance of two structures drawn from the ensemble (as RNAfold)."""
    upper = np.triu(probs, 1)
    return float(2.0 * np.sum(upper * (1.0 - upper)))


def bpp_lines(probs: np.ndarray, cutoff: float = 1e-5) -> str:
    """``i j p`` lines (1-based, ``i < j``) for every pair with probability >= ``cutoff``."""
    ii, jj = np.nonzero(np.triu(probs, 1) >= cutoff)
    return "".join(f"{i + 1} {j + 1} {probs[i, j]:.6g}\n" for i, j in zip(ii.tolist(), jj.tolist()))


def bpp_text(result: FoldResult, cutoff: float = 1e-5) -> str:
    """The ``_bpp.txt`` file of a result: ``#`` header lines (what the columns are; positions
    are 1-based), then :func:`bpp_lines`. ``numpy.loadtxt`` reads it as an ``[m, 3]`` array."""
    rec = result.record
    return (f"# base-pair probabilities of {rec.id} (n = {len(rec.sequence)}), from foldax fold -p\n"
            f"# columns: i j p -- positions i < j are 1-based (the first nucleotide is 1); "
            f"p = P(i pairs with j), pairs with p >= {cutoff:g}\n" + bpp_lines(result.probs, cutoff))


def _record(result: FoldResult):
    from foldax.data.formats import RnaRecord

    return RnaRecord(result.record.id, result.record.sequence, result.structure, result.record.source)


def _ensemble_value(result: FoldResult) -> str:
    """The ``[...]`` of the ensemble line: RNAfold's ensemble free energy for an energy model,
    else the labelled log Z (a plain score must not pass for kcal/mol)."""
    if result.is_energy:
        return f"[{result.ensemble_energy:6.2f}]"
    return f"[log Z = {result.log_z:.2f}]"


def _ensemble_lines(result: FoldResult) -> list[str]:
    """The lines after the structure when log Z is known (see :func:`format_result`)."""
    lines = []
    if result.probs is None:
        label = "ensemble free energy" if result.is_energy else "ensemble"
        lines.append(f"{label} {_ensemble_value(result)}")
        diversity = ""
    else:
        lines.append(f"{ensemble_string(result.probs)} {_ensemble_value(result)}")
        diversity = ensemble_diversity(result.probs)
    if result.centroid is not None:
        lines.append(f"{to_dot_bracket(result.centroid)} {{{result.centroid_energy:6.2f} "
                     f"d={result.centroid_distance:.2f}}}")
    if result.is_energy and result.decoder == "mfe":  # RNAfold's line, to the letter
        tail = "" if diversity == "" else f"; ensemble diversity {diversity:<6.2f}"
        lines.append(f" frequency of mfe structure in ensemble {result.probability:g}{tail}")
    else:
        tail = "" if diversity == "" else f"; ensemble diversity {diversity:.2f}"
        lines.append(f" frequency of the structure in the ensemble {result.probability:.6g}{tail}")
    return lines


def format_result(result: FoldResult, fmt: str = "dbn", *, comments: bool = False) -> str:
    """The text printed (and written) for one result in ``fmt`` (``dbn``, ``bpseq`` or ``ct``).

    dbn: ``>id`` and the rest of its FASTA header, the sequence, ``structure (value)`` --
    the structure's score, or its free energy in kcal/mol for an energy model (RNAfold) --
    and, when log Z is known, the ensemble line ``pseudo-brackets [log Z = ...]`` (``[-kT log Z]`` for an
    energy model, as RNAfold), for an energy model RNAfold's centroid line
    ``structure { E d=D}``, and a line with the structure's probability in the
    ensemble and the ensemble diversity -- for an energy model's minimum free energy
    structure RNAfold's `` frequency of mfe structure in ensemble P; ensemble diversity
    D`` (with ``comments=True``, as used for files, these lines start with ``# `` so
    that the text stays a valid .dbn file).
    bpseq: ``# id`` then ``# score = S ...`` (or ``# energy = E kcal/mol``) and
    ``# log Z = ...`` comment lines, then ``i base partner``. ct: header ``n  id  score
    = S (...)  log Z = ...``; only an energy model writes ``n  ENERGY = E  id`` (CT
    readers take ``ENERGY`` for a free energy in kcal/mol). The structure part is
    written by :func:`foldax.data.formats.format_records` and reads back with
    :func:`foldax.data.formats.parse_records`.
    """
    value = result.energy if result.is_energy else result.score
    if fmt == "dbn":
        rec = result.record
        title = f"{rec.id} {rec.description}" if rec.description else rec.id
        text = f">{title}\n{rec.sequence}\n{to_dot_bracket(result.structure)} ({value:6.2f})\n"
        if result.log_z is not None:
            text += "".join(f"{'# ' if comments else ''}{line}\n" for line in _ensemble_lines(result))
        return text
    from foldax.data.formats import format_records

    rec = _record(result)
    if fmt == "bpseq":
        body = format_records([rec], "bpseq")
        head, rest = body.split("\n", 1)
        if result.is_energy:
            extra = f"# energy = {value:.2f} kcal/mol\n"
        else:
            extra = f"# score = {value:.2f} (model log-score, higher is better; not a free energy)\n"
        if result.log_z is not None:
            ensemble = (f"ensemble free energy = {result.ensemble_energy:.2f} kcal/mol" if result.is_energy
                        else f"log Z = {result.log_z:.4f}")
            extra += f"# {ensemble}; frequency in the ensemble = {result.probability:.6g}\n"
        return f"{head}\n{extra}{rest}"
    if fmt == "ct":
        body = format_records([rec], "ct")
        head, rest = body.split("\n", 1)
        n, rid = head.split("\t", 1)
        if result.is_energy:
            extra = (f"\tensemble free energy = {result.ensemble_energy:.2f}" if result.log_z is not None else "")
            return f"{n}\tENERGY = {value:.2f}\t{rid}{extra}\n{rest}"
        extra = f"\tlog Z = {result.log_z:.4f}" if result.log_z is not None else ""
        return f"{n}\t{rid}\tscore = {value:.2f} (model log-score, not a free energy){extra}\n{rest}"
    raise ValueError(f"unknown output format {fmt!r} (dbn, bpseq or ct)")


def sample_lines(result: FoldResult) -> list[str]:
    """One line per sample of ``result``, as ``RNAsubopt -p --stochBT_en`` prints them:
    ``structure value probability`` -- the free energy (kcal/mol, ``eval_structure``'s) for an energy
    model, else the model's score -- and the structure's probability in the ensemble it was drawn
    from. No samples: no lines.

    >>> r = FoldResult(InputRecord("x", "GGGAAACCC"), np.full(9, -1), 0.0, energy_kT=0.6,
    ...                samples=np.array([[8, 7, -1, -1, -1, -1, -1, 1, 0]]), sample_scores=np.array([2.0]),
    ...                sample_energies=np.array([-1.2]), sample_log_probs=np.array([-0.5]))
    >>> sample_lines(r)
    ['((.....))  -1.20 0.606531']
    """
    if result.samples is None:
        return []
    values = result.sample_energies if result.is_energy else result.sample_scores
    if result.is_energy and values is None:
        values = -result.energy_kT * result.sample_scores + 0.0
    return [f"{to_dot_bracket(table)} {value:6.2f} {math.exp(min(log_prob, 0.0)):6g}"
            for table, value, log_prob in zip(result.samples, values, result.sample_log_probs)]


def samples_text(result: FoldResult) -> str:
    """The ``_samples.txt`` file of a result: ``#`` lines (what the columns are), ``>id``, the
    sequence and :func:`sample_lines`."""
    rec = result.record
    value = "free energy (kcal/mol)" if result.is_energy else "score (model log-score, not a free energy)"
    return (f"# {len(result.samples)} structures sampled from the ensemble of {rec.id}, by foldax fold --sample\n"
            f"# columns: structure, its {value}, its probability in the ensemble\n"
            f">{rec.id}\n{rec.sequence}\n" + "".join(f"{line}\n" for line in sample_lines(result)))


def output_names(ids: Iterable[str]) -> list[str]:
    """File-name stems for record ids: unsafe characters become ``_``; repeats get ``_2``, ``_3``..."""
    seen: dict[str, int] = {}
    out = []
    for rid in ids:
        stem = re.sub(r"[^A-Za-z0-9._+-]", "_", rid).lstrip(".") or "seq"
        seen[stem] = seen.get(stem, 0) + 1
        out.append(stem if seen[stem] == 1 else f"{stem}_{seen[stem]}")
    return out


def reference_pairs(record: InputRecord) -> list[tuple[int, int]]:
    return [] if record.reference is None else pairs_from_table(record.reference)
