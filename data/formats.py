"""Readers and writers for RNA sequence and secondary-structure files.

Supported formats (chosen by file extension, or ``fmt=`` explicitly):

========  ======================  ==============================================
fmt       extensions              layout
========  ======================  ==============================================
fasta     .fa .fasta .fna .fas    ``>id description`` then sequence lines (may be
                                  wrapped); ``;`` comment lines. No structure:
                                  records have ``pair_table=None``.
dbn       .dbn .db                records of: an optional ``>id`` line, ONE
                                  sequence line, ONE dot-bracket line, optionally
                                  followed by a score in parentheses, e.g.
                                  ``((..)) (-12.30)``. Wrapped sequences or
                                  structures are not supported. Blank lines and
                                  ``#`` lines are ignored. Brackets ``[]{}<>``
                                  and ``Aa``.. mark pseudoknots.
bpseq     .bpseq                  one structure per file: optional header lines
                                  (the first ``# name`` or ``#Name: name`` line
                                  gives the id; others such as ``Filename: ..``
                                  are ignored), then ``index base partner``
                                  lines (1-based, partner 0 = unpaired).
ct        .ct                     mfold/RNAstructure connect tables, several per
                                  file. Header ``N title``, ``N ENERGY = e
                                  title`` or ``N dG = e title``; then N lines
                                  ``index base prev next partner natural``. Only
                                  columns 1, 2 and 5 are used.
tsv       .tsv                    one header line with (at least) the columns
                                  ``id``, ``sequence``, ``structure``
                                  (dot-bracket); tab separated, no quoting.
========  ======================  ==============================================

Record ids: the first word of the FASTA/dbn ``>`` line, of the CT title, of a
BPSEQ ``# name`` line, or the ``id`` column. A record without one gets the
file's stem, or ``<stem>_<k>`` (``k`` = 1-based record number) when the file
holds several records.

Sequences are upper-cased with ``T`` read as ``U``. Allowed letters: ``ACGUTN``
and the IUPAC codes ``RYKMSWBDHV`` (any case); anything else is an error.

Malformed input raises :class:`FormatError` (a ``ValueError``) naming the file,
the line (1-based) and what is wrong. ``strict=False`` skips bad records and
counts them by reason in a :class:`LoadReport` instead. Structures with
crossing pairs are handled by ``pseudoknots=``: ``"reduce"`` (keep a maximum
nested subset, see :func:`foldax.layers.dotbracket.max_nested_subset`; counted),
``"skip"`` (drop the record; counted), ``"error"`` (a :class:`FormatError`, or
in lenient mode skipped and counted as ``"pseudoknot"``) or ``"keep"`` (keep the
crossing pairs, for evaluation or conversion).

The writers produce a canonical form of each format; reading it back gives
equal records (:meth:`RnaRecord.__eq__`) and writing those again gives the
same text. Energies/scores and CT columns 3, 4 and 6 are not kept.

>>> text = ">hp\\nGGGAAACCC\\n(((...))) (-1.20)\\n"
>>> [rec] = parse_records(text, "dbn")
>>> rec.id, rec.sequence, rec.dot_bracket
('hp', 'GGGAAACCC', '(((...)))')
>>> print(format_records([rec], "bpseq"), end="")
# hp
1 G 9
2 G 8
3 G 7
4 A 0
5 A 0
6 A 0
7 C 3
8 C 2
9 C 1
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from foldax.layers.dotbracket import (
    StructureError,
    find_crossing,
    from_dot_bracket,
    max_nested_subset,
    pairs_from_table,
    to_dot_bracket,
    validate_pair_table,
)

__all__ = [
    "FORMATS",
    "PSEUDOKNOT_POLICIES",
    "FormatError",
    "LoadReport",
    "RnaRecord",
    "format_of",
    "format_records",
    "load_records",
    "parse_records",
    "read_records",
    "resolve_paths",
    "write_records",
]

PSEUDOKNOT_POLICIES = ("reduce", "skip", "error", "keep")
#: Letters accepted in sequences (any case): nucleotides and IUPAC ambiguity codes.
ALLOWED_LETTERS = "ACGUTN" + "RYKMSWBDHV"
_BAD_LETTER = re.compile(f"[^{ALLOWED_LETTERS}]", re.IGNORECASE)


class FormatError(ValueError):
    """Malformed input, with where it was found.

    Attributes:
      path: the file (or a name given to :func:`parse_records`).
      line: 1-based line number, or None.
      record: the record's id when known, else None.
      reason: a tag used for counting in lenient mode: ``"syntax"``,
        ``"truncated"``, ``"empty"``, ``"bad_letter"``, ``"length_mismatch"``,
        ``"unbalanced"``, ``"bad_structure"``, ``"partner"`` or ``"pseudoknot"``.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None, record: str | None = None,
                 reason: str = "syntax"):
        self.path, self.line, self.record, self.reason = str(path), line, record, reason
        self.detail = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" (record {record!r})" if record else ""
        super().__init__(f"{where}: {message}{what}")


@dataclasses.dataclass(frozen=True, eq=False)
class RnaRecord:
    """One RNA: id, sequence and (optionally) its secondary structure.

    ``pair_table`` is a read-only int32 pair table (see :mod:`foldax.layers.dotbracket`)
    or None when the file had no structure (FASTA). ``source`` is ``file:line``
    of the record's first line. Equality compares id, sequence and pair table
    (not ``source``); records are not hashable.

    >>> a = RnaRecord("x", "GAAAC", np.array([4, -1, -1, -1, 0]))
    >>> a.dot_bracket, a.length, a.pairs
    ('(...)', 5, [(0, 4)])
    >>> a == RnaRecord("x", "GAAAC", from_dot_bracket("(...)"), source="elsewhere:3")
    True
    """

    id: str
    sequence: str
    pair_table: np.ndarray | None
    source: str = ""

    def __post_init__(self):
        if self.pair_table is not None:
            pt = validate_pair_table(self.pair_table, nested=False).copy()
            if len(pt) != len(self.sequence):
                raise ValueError(
                    f"record {self.id!r}: pair table has length {len(pt)}, sequence {len(self.sequence)}"
                )
            pt.setflags(write=False)
            object.__setattr__(self, "pair_table", pt)

    def __eq__(self, other):
        if not isinstance(other, RnaRecord):
            return NotImplemented
        if (self.pair_table is None) != (other.pair_table is None):
            return False
        return (
            self.id == other.id
            and self.sequence == other.sequence
            and (self.pair_table is None or np.array_equal(self.pair_table, other.pair_table))
        )

    __hash__ = None  # mutable-looking contents (ndarray); not hashable

    @property
    def length(self) -> int:
        return len(self.sequence)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """0-based pairs ``(i, j)``, ``i < j``."""
        return [] if self.pair_table is None else pairs_from_table(self.pair_table)

    @property
    def dot_bracket(self) -> str | None:
        """Dot-bracket string (pseudoknot brackets when pairs cross), or None."""
        return None if self.pair_table is None else to_dot_bracket(self.pair_table, allow_pseudoknots=True)

    def replace(self, **changes) -> RnaRecord:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class LoadReport:
    """What a load did: files read, records kept, records skipped per reason.

    ``skipped`` counts records dropped in lenient mode (by
    :attr:`FormatError.reason`) and by ``pseudoknots="skip"`` (as
    ``"pseudoknot"``); ``errors`` holds their messages. ``pseudoknots_reduced``
    counts records whose crossing pairs were reduced and ``pairs_removed`` the
    pairs that dropped.
    """

    files: list[str] = dataclasses.field(default_factory=list)
    n_records: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    pseudoknots_reduced: int = 0
    pairs_removed: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def skip(self, reason: str, message: str) -> None:
        self.skipped[reason] += 1
        self.errors.append(message)

    def summary(self) -> str:
        parts = [f"{self.n_records} records from {len(self.files)} files"]
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())))
        if self.pseudoknots_reduced:
            parts.append(f"{self.pseudoknots_reduced} pseudoknotted reduced ({self.pairs_removed} pairs removed)")
        return "; ".join(parts)


# --------------------------------------------------------------------------- #
# shared helpers
# --------------------------------------------------------------------------- #

_Lines = Sequence[tuple[int, str]]  # (1-based line number, text without newline)


def _normalize_sequence(seq: str, *, path: str, line: int, record: str | None,
                        lines: Sequence[int] | None = None) -> str:
    """Upper case, T -> U; raises FormatError on a letter outside ACGUTN + IUPAC.

    ``lines`` (one line number per nucleotide, CT/BPSEQ) makes the error name
    the offending nucleotide's own line.
    """
    if not seq:
        raise FormatError("empty sequence", path=path, line=line, record=record, reason="empty")
    bad = _BAD_LETTER.search(seq)
    if bad:
        pos = bad.start()
        raise FormatError(
            f"invalid nucleotide {bad.group()!r} at sequence position {pos + 1} "
            f"(allowed: {ALLOWED_LETTERS}, any case)",
            path=path, line=lines[pos] if lines else line, record=record, reason="bad_letter",
        )
    return seq.upper().replace("T", "U")


def _table_from_dot_bracket(structure: str, seq_len: int, *, path: str, line: int, record: str | None):
    if len(structure) != seq_len:
        raise FormatError(
            f"structure has length {len(structure)} but the sequence has {seq_len}",
            path=path, line=line, record=record, reason="length_mismatch",
        )
    try:
        return from_dot_bracket(structure, allow_pseudoknots=True)
    except StructureError as err:
        reason = "unbalanced" if err.reason == "unbalanced" else "bad_structure"
        message = re.sub(r"at position (\d+)", lambda m: f"at column {int(m.group(1)) + 1}", str(err))
        raise FormatError(message, path=path, line=line, record=record, reason=reason) from None


def _table_from_partners(partners: Sequence[int], lines: Sequence[int], *, path: str, record: str | None):
    """1-based partner list (0 = unpaired) -> 0-based pair table, checked.

    Raises FormatError naming the line of the first nucleotide whose partner is
    out of range, itself, or does not point back.
    """
    n = len(partners)
    # Partners are Python ints of any size (a file may say 99999999999999999999): anything outside
    # 0..n is out of range, so it becomes -1 before it meets int64.
    p = np.array([q if 0 <= q <= n else -1 for q in partners], dtype=np.int64)
    index = np.arange(1, n + 1)
    in_range = p >= 1
    back = np.zeros(n, dtype=np.int64)
    back[in_range] = p[p[in_range] - 1]
    bad = np.flatnonzero((p != 0) & (~in_range | (p == index) | (back != index)))
    if bad.size:
        i = int(bad[0])
        k, q = i + 1, int(partners[i])
        if not 1 <= q <= n:
            problem = f"nucleotide {k} has partner {q}, out of range 1..{n}"
        elif q == k:
            problem = f"nucleotide {k} is paired with itself"
        else:
            problem = (f"asymmetric pair: nucleotide {k} pairs with {q} but nucleotide {q} "
                       f"(line {lines[q - 1]}) pairs with {int(p[q - 1])}")
        raise FormatError(problem, path=path, line=lines[i], record=record, reason="partner")
    return (p - 1).astype(np.int32)


def _first_word(text: str) -> str | None:
    words = text.split()
    return words[0] if words else None


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


# A parser (``_parse_<fmt>(lines, path)``) turns numbered lines into a stream of
# RnaRecord (id None when the file has none) and FormatError items; an error
# that breaks the framing ends the stream.


# --------------------------------------------------------------------------- #
# FASTA
# --------------------------------------------------------------------------- #


def _parse_fasta(lines: _Lines, path: str) -> Iterator:
    header: tuple[int, str | None] | None = None
    chunks: list[str] = []
    for line, text in list(lines) + [(None, ">")]:
        text = text.strip()
        if not text or text.startswith(";"):
            continue
        if not text.startswith(">"):
            if header is None:
                yield FormatError("sequence line before the first '>' header", path=path, line=line)
                return
            chunks.append(text)
            continue
        if header is not None:
            start, rid = header
            try:
                seq = _normalize_sequence("".join(chunks), path=path, line=start, record=rid)
                yield RnaRecord(rid, seq, None, f"{path}:{start}")
            except FormatError as err:
                yield err
        header, chunks = (line, _first_word(text[1:])), []


def _format_fasta(records: Sequence[RnaRecord]) -> str:
    return "".join(f">{r.id}\n{r.sequence}\n" for r in records)


# --------------------------------------------------------------------------- #
# dot-bracket (.dbn)
# --------------------------------------------------------------------------- #

_SCORE = re.compile(r"^[(\[]\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[)\]]$")


def _parse_dbn(lines: _Lines, path: str) -> Iterator:
    content = [(n, t.strip()) for n, t in lines if t.strip() and not t.lstrip().startswith("#")]
    k = 0
    while k < len(content):
        start, text = content[k]
        rid = None
        if text.startswith(">"):
            rid = _first_word(text[1:])
            k += 1
        body = []
        while len(body) < 2 and k < len(content) and not content[k][1].startswith(">"):
            body.append(content[k])
            k += 1
        if len(body) < 2:
            missing = "sequence and structure lines" if not body else "structure line"
            yield FormatError(f"truncated record: missing {missing}", path=path,
                              line=(body or [(start, "")])[-1][0], record=rid, reason="truncated")
            continue
        try:
            yield _dbn_record(rid, body, start, path)
        except FormatError as err:
            yield err


def _dbn_record(rid, body, start, path) -> RnaRecord:
    (seq_line, seq), (st_line, st_text) = body
    seq = _normalize_sequence(seq, path=path, line=seq_line, record=rid)
    structure, *rest = st_text.split(None, 1)
    rest = rest[0].strip() if rest else ""
    if rest and not _SCORE.match(rest):
        raise FormatError(f"unexpected text after the structure: {rest!r} (expected a score like "
                          "'(-12.30)')", path=path, line=st_line, record=rid)
    pt = _table_from_dot_bracket(structure, len(seq), path=path, line=st_line, record=rid)
    return RnaRecord(rid, seq, pt, f"{path}:{start}")


def _format_dbn(records: Sequence[RnaRecord]) -> str:
    return "".join(f">{r.id}\n{r.sequence}\n{r.dot_bracket}\n" for r in _with_structure(records, "dbn"))


# --------------------------------------------------------------------------- #
# BPSEQ
# --------------------------------------------------------------------------- #

_BPSEQ_NAME = re.compile(r"^#\s*(?:Name:\s*)?(\S+)")


def _parse_bpseq(lines: _Lines, path: str) -> Iterator:
    rid, start = None, None
    bases, partners, numbers = [], [], []
    for line, text in lines:
        fields = text.split()
        if not fields:
            continue
        start = start or line
        is_data = len(fields) == 3 and _as_int(fields[0]) is not None and _as_int(fields[2]) is not None
        if not is_data:
            if bases:
                yield FormatError(f"malformed line {text.strip()!r} (expected 'index base partner')",
                                  path=path, line=line, record=rid, reason="truncated" if len(fields) < 3 else "syntax")
                return
            match = _BPSEQ_NAME.match(text.strip())
            if rid is None and match:
                rid = match.group(1)
            continue
        error = _add_nucleotide((bases, partners, numbers), int(fields[0]), fields[1], int(fields[2]),
                                path=path, line=line, record=rid)
        if error is not None:
            yield error
            return
    if not bases:
        yield FormatError("no 'index base partner' lines", path=path, record=rid, reason="empty")
        return
    yield _partner_record(rid, bases, partners, numbers, start, path)


def _add_nucleotide(columns, index: int, base: str, partner: int, *, path: str, line: int, record: str | None
                    ) -> FormatError | None:
    """Appends one CT/BPSEQ nucleotide line to ``columns = (bases, partners, line numbers)``; returns
    the FormatError (not raised: the parsers yield it) when ``index`` is not the next one."""
    bases, partners, numbers = columns
    if index != len(bases) + 1:
        return FormatError(f"expected nucleotide index {len(bases) + 1}, found {index}", path=path, line=line,
                           record=record)
    bases.append(base)
    partners.append(partner)
    numbers.append(line)
    return None


def _partner_record(rid, bases, partners, numbers, start, path):
    """Record (or FormatError) from CT/BPSEQ columns."""
    try:
        for base, line in zip(bases, numbers):
            if len(base) != 1:
                raise FormatError(f"expected one nucleotide letter, found {base!r}", path=path, line=line,
                                  record=rid, reason="bad_letter")
        seq = _normalize_sequence("".join(bases), path=path, line=start, record=rid, lines=numbers)
        pt = _table_from_partners(partners, numbers, path=path, record=rid)
        return RnaRecord(rid, seq, pt, f"{path}:{start}")
    except FormatError as err:
        return err


def _partner_lines(record: RnaRecord) -> Iterator[tuple[int, str, int]]:
    """(1-based index, base, 1-based partner or 0) per nucleotide."""
    partners = (record.pair_table + 1).tolist()
    return zip(range(1, record.length + 1), record.sequence, partners)


def _format_bpseq(records: Sequence[RnaRecord]) -> str:
    records = _with_structure(records, "bpseq")
    if len(records) != 1:
        raise ValueError(f"a BPSEQ file holds exactly one structure, got {len(records)} records")
    [record] = records
    return f"# {record.id}\n" + "".join(f"{i} {b} {p}\n" for i, b, p in _partner_lines(record))


# --------------------------------------------------------------------------- #
# CT (connect table)
# --------------------------------------------------------------------------- #

# "ENERGY = -12.3  name", "dG = -21.60  [initially -22.70]  name" (mfold)
_CT_ENERGY = re.compile(r"^(?:ENERGY|dG)\s*=\s*\S+\s*(?:\[[^\]]*\]\s*)?(.*)$", re.IGNORECASE)


_CT_COUNT = re.compile(r"[0-9]+")
_CT_SIGNED = re.compile(r"-?[0-9]+")


def _is_ct_data_line(cols: Sequence[str]) -> bool:
    """``index base prev next partner natural``: six fields, all but the base integers (ASCII digits,
    at most one leading ``-`` on the last two: ``int()`` reads every field that passes)."""
    return (
        len(cols) == 6
        and all(_CT_COUNT.fullmatch(c) for c in (cols[0], cols[2], cols[3]))
        and all(_CT_SIGNED.fullmatch(c) for c in (cols[4], cols[5]))
    )


def _ct_header(text: str) -> tuple[int, str | None] | None:
    """``(n, id)`` from a CT header line, or None if the line is not one."""
    fields = text.split(None, 1)
    n = _as_int(fields[0])
    if n is None or n < 0 or _is_ct_data_line(text.split()):
        return None
    title = fields[1].strip() if len(fields) > 1 else ""
    energy = _CT_ENERGY.match(title)
    return n, _first_word(energy.group(1) if energy else title)


_CT_LINE = re.compile(r"^[ \t]*(\d+)[ \t]+(\S+)[ \t]+\d+[ \t]+\d+[ \t]+(-?\d+)[ \t]+-?\d+[ \t]*$", re.MULTILINE)


def _ct_block(block: _Lines, n: int):
    """Fast path: ``(bases, partners, line numbers)`` of ``n`` regular CT lines, else None."""
    rows = _CT_LINE.findall("\n".join(text for _, text in block))
    if len(rows) != n or len(block) != n:
        return None
    if [int(r[0]) for r in rows] != list(range(1, n + 1)):
        return None
    return [r[1] for r in rows], [int(r[2]) for r in rows], [line for line, _ in block]


def _parse_ct(lines: _Lines, path: str) -> Iterator:
    content = [(n, t) for n, t in lines if t.strip()]
    k = 0
    while k < len(content):
        start, header = content[k]
        parsed = _ct_header(header)
        if parsed is None:
            extra = " (more nucleotide lines than the header declares?)" if _is_ct_data_line(header.split()) else ""
            yield FormatError(f"expected a CT header 'N title', found {header.strip()[:60]!r}{extra}",
                              path=path, line=start)
            return
        n, rid = parsed
        k += 1
        block = _ct_block(content[k:k + n], n)
        if block is not None:
            k += n
            yield _partner_record(rid, *block, start, path)
            continue
        bases, partners, numbers = [], [], []  # slow path, line by line, for a precise error
        while len(bases) < n and k < len(content):
            line, text = content[k]
            cols = text.split()
            if not _is_ct_data_line(cols):
                if len(cols) == 6 and cols[0] == str(len(bases) + 1):  # the next nucleotide, but malformed
                    yield FormatError(f"malformed nucleotide line {text.strip()[:60]!r} (expected 'index base "
                                      f"prev next partner natural': integers but the base)", path=path, line=line,
                                      record=rid)
                    return
                break  # the next header (or junk): the record is truncated
            error = _add_nucleotide((bases, partners, numbers), int(cols[0]), cols[1], int(cols[4]),
                                    path=path, line=line, record=rid)
            if error is not None:
                yield error
                return
            k += 1
        if len(bases) < n:
            where = "the end of the file" if k == len(content) else f"line {content[k][0]}"
            yield FormatError(f"truncated record: the header declares {n} nucleotides but {where} follows "
                              f"after {len(bases)}", path=path, line=start, record=rid, reason="truncated")
            if k < len(content) and _ct_header(content[k][1]) is None:
                return  # junk, not the next record: stop here
            continue
        yield _partner_record(rid, bases, partners, numbers, start, path)


def _format_ct(records: Sequence[RnaRecord]) -> str:
    out = []
    for r in _with_structure(records, "ct"):
        n = r.length
        out.append(f"{n}\t{r.id}\n")
        out.extend(f"{i}\t{b}\t{i - 1}\t{i + 1 if i < n else 0}\t{p}\t{i}\n" for i, b, p in _partner_lines(r))
    return "".join(out)


# --------------------------------------------------------------------------- #
# TSV
# --------------------------------------------------------------------------- #

_TSV_COLUMNS = ("id", "sequence", "structure")


def _parse_tsv(lines: _Lines, path: str) -> Iterator:
    rows = [(n, t) for n, t in lines if t.strip()]
    if not rows:
        yield FormatError("empty TSV file (expected a header line)", path=path, reason="empty")
        return
    head_line, head = rows[0]
    names = head.split("\t")
    missing = [c for c in _TSV_COLUMNS if c not in names]
    if missing:
        yield FormatError(f"header lacks column(s) {', '.join(missing)} (found {names})", path=path, line=head_line)
        return
    col = {c: names.index(c) for c in _TSV_COLUMNS}
    for line, text in rows[1:]:
        cells = text.split("\t")
        if len(cells) != len(names):
            yield FormatError(f"expected {len(names)} tab-separated fields, found {len(cells)}", path=path,
                              line=line, reason="truncated" if len(cells) < len(names) else "syntax")
            continue
        rid = cells[col["id"]].strip() or None
        try:
            seq = _normalize_sequence(cells[col["sequence"]].strip(), path=path, line=line, record=rid)
            pt = _table_from_dot_bracket(cells[col["structure"]].strip(), len(seq), path=path, line=line,
                                         record=rid)
            yield RnaRecord(rid, seq, pt, f"{path}:{line}")
        except FormatError as err:
            yield err


def _format_tsv(records: Sequence[RnaRecord]) -> str:
    records = _with_structure(records, "tsv")
    for r in records:
        if re.search(r"[\t\n\r]", r.id):
            raise ValueError(f"record id {r.id!r} contains a tab or newline; cannot write TSV")
    return "\t".join(_TSV_COLUMNS) + "\n" + "".join(f"{r.id}\t{r.sequence}\t{r.dot_bracket}\n" for r in records)


def _with_structure(records: Sequence[RnaRecord], fmt: str) -> list[RnaRecord]:
    records = list(records)
    for r in records:
        if r.pair_table is None:
            raise ValueError(f"record {r.id!r} has no structure; cannot write {fmt}")
    return records


# --------------------------------------------------------------------------- #
# dispatch
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class _Format:
    extensions: tuple[str, ...]
    parse: Callable[[_Lines, str], Iterator]
    format: Callable[[Sequence[RnaRecord]], str]


FORMATS: dict[str, _Format] = {
    "fasta": _Format((".fa", ".fasta", ".fna", ".fas"), _parse_fasta, _format_fasta),
    "dbn": _Format((".dbn", ".db"), _parse_dbn, _format_dbn),
    "bpseq": _Format((".bpseq",), _parse_bpseq, _format_bpseq),
    "ct": _Format((".ct",), _parse_ct, _format_ct),
    "tsv": _Format((".tsv",), _parse_tsv, _format_tsv),
}
_BY_EXTENSION = {ext: name for name, f in FORMATS.items() for ext in f.extensions}


def format_of(path: str | os.PathLike) -> str:
    """The format name for a path's extension (case-insensitive).

    >>> format_of("x/tRNA.CT"), format_of("a.fasta")
    ('ct', 'fasta')
    """
    ext = Path(path).suffix.lower()
    if ext not in _BY_EXTENSION:
        raise ValueError(f"{path}: unknown extension {ext!r} (known: {' '.join(sorted(_BY_EXTENSION))})")
    return _BY_EXTENSION[ext]


def _check_policy(pseudoknots: str) -> None:
    if pseudoknots not in PSEUDOKNOT_POLICIES:
        raise ValueError(f"pseudoknots must be one of {PSEUDOKNOT_POLICIES}, got {pseudoknots!r}")


def _apply_pseudoknot_policy(record: RnaRecord, policy: str, report: LoadReport) -> RnaRecord | None:
    """Returns the record to keep (possibly reduced) or None when skipped."""
    if record.pair_table is None or policy == "keep":
        return record
    crossing = find_crossing(record.pair_table)
    if crossing is None:
        return record
    if policy == "reduce":
        nested = max_nested_subset(record.pair_table)
        report.pseudoknots_reduced += 1
        report.pairs_removed += int(np.count_nonzero(record.pair_table >= 0) - np.count_nonzero(nested >= 0)) // 2
        return record.replace(pair_table=nested)
    path, _, line = record.source.rpartition(":")
    (i, j), (k, l) = crossing
    error = FormatError(f"pseudoknot: pairs {i + 1}-{j + 1} and {k + 1}-{l + 1} cross (1-based)",
                        path=path, line=_as_int(line), record=record.id, reason="pseudoknot")
    if policy == "error":
        raise error
    report.skip("pseudoknot", str(error))
    return None


def parse_records(text: str, fmt: str, *, name: str = "<string>", strict: bool = True,
                  pseudoknots: str = "reduce", report: LoadReport | None = None) -> list[RnaRecord]:
    """Parses the text of one file in format ``fmt`` (see the module docstring).

    ``name`` is used as the file name in ids, sources and error messages.
    With ``strict=False`` bad records are skipped and counted in ``report``.
    """
    _check_policy(pseudoknots)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    report = LoadReport() if report is None else report
    lines = list(enumerate(text.splitlines(), start=1))
    items = list(FORMATS[fmt].parse(lines, name))
    stem = Path(name).stem
    records = []
    for k, item in enumerate(items, start=1):
        if isinstance(item, FormatError):
            if strict:
                raise item
            report.skip(item.reason, str(item))
            continue
        if item.id is None:
            item = item.replace(id=stem if len(items) == 1 else f"{stem}_{k}")
        try:
            item = _apply_pseudoknot_policy(item, pseudoknots, report)
        except FormatError as err:
            if strict:
                raise
            report.skip(err.reason, str(err))
            continue
        if item is not None:
            records.append(item)
    report.n_records += len(records)
    return records


def read_records(path: str | os.PathLike, *, fmt: str | None = None, strict: bool = True,
                 pseudoknots: str = "reduce", report: LoadReport | None = None) -> list[RnaRecord]:
    """Reads one file; the format comes from the extension unless ``fmt`` is given."""
    path = os.fspath(path)
    fmt = fmt or format_of(path)
    with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
        text = fh.read()
    if report is not None:
        report.files.append(path)
    return parse_records(text, fmt, name=path, strict=strict, pseudoknots=pseudoknots, report=report)


def resolve_paths(paths_or_globs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Expands comma-separated lists, globs and directories into sorted file paths.

    A directory contributes every file below it (recursively) with a known
    extension; a glob or a file is taken as is. Duplicates are dropped, order is
    kept. A pattern that matches nothing, or a missing file, is an error.
    """
    if isinstance(paths_or_globs, (str, os.PathLike)):
        paths_or_globs = [paths_or_globs]
    items = [p.strip() for item in paths_or_globs for p in os.fspath(item).split(",") if p.strip()]
    out: dict[str, None] = {}
    for item in items:
        if os.path.isdir(item):
            found = sorted(str(p) for p in Path(item).rglob("*") if p.is_file() and p.suffix.lower() in _BY_EXTENSION)
        elif glob.has_magic(item):
            found = sorted(glob.glob(item, recursive=True))
        else:
            found = [item] if os.path.isfile(item) else []
        if not found:
            raise FileNotFoundError(f"no RNA files found for {item!r}")
        out.update(dict.fromkeys(found))
    return list(out)


def load_records(paths_or_globs, *, strict: bool = True, pseudoknots: str = "reduce",
                 fmt: str | None = None) -> tuple[list[RnaRecord], LoadReport]:
    """Loads every record from files, directories, globs or comma-separated lists.

    Returns ``(records, report)``. See the module docstring for formats,
    ``strict`` and ``pseudoknots``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.dbn").write_text(">a\\nGGAAACC\\n((...))\\n>b\\nGGAAACC\\n((...).\\n")
    >>> records, report = load_records(str(d), strict=False)
    >>> [r.id for r in records], dict(report.skipped)
    (['a'], {'unbalanced': 1})
    """
    _check_policy(pseudoknots)
    report = LoadReport()
    records = []
    for path in resolve_paths(paths_or_globs):
        records.extend(read_records(path, fmt=fmt, strict=strict, pseudoknots=pseudoknots, report=report))
    return records, report


def format_records(records: Iterable[RnaRecord], fmt: str) -> str:
    """The text of a file in format ``fmt`` holding ``records`` (BPSEQ: exactly one)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    return FORMATS[fmt].format(list(records))


def write_records(path: str | os.PathLike, records: Iterable[RnaRecord], *, fmt: str | None = None) -> None:
    """Writes records to ``path`` in the format of its extension (or ``fmt``)."""
    text = format_records(records, fmt or format_of(path))
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
