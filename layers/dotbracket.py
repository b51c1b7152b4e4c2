"""Secondary structures: dot-bracket strings, pair tables and pair lists.

The project's internal form of a structure is a *pair table*: an int32 array
``pt`` of length ``n`` with ``pt[i] = j`` when (0-based) position ``i`` pairs
with ``j`` and ``pt[i] = -1`` when ``i`` is unpaired; it is symmetric
(``pt[pt[i]] == i``). All positions in this module, including the ones in error
messages, are 0-based.

Dot-bracket notation writes one character per position: ``.`` unpaired, ``(``
and ``)`` the two ends of a pair. Pseudoknotted structures (crossing pairs
``i < k < j < l``) need more bracket kinds; with ``allow_pseudoknots=True`` the
functions also accept/write ``[]``, ``{}``, ``<>`` and the letter pairs
``Aa``, ``Bb``, ... ``Zz`` (upper case opens, lower case closes), as in
ViennaRNA, bpRNA and RNAstructure.

>>> pt = from_dot_bracket("((..))")
>>> pt.tolist()
[5, 4, -1, -1, 1, 0]
>>> to_dot_bracket(pt)
'((..))'
>>> pairs_from_table(pt)
[(0, 5), (1, 4)]
"""

from __future__ import annotations

import string
from collections.abc import Iterable

import numpy as np

__all__ = [
    "BRACKETS",
    "StructureError",
    "from_dot_bracket",
    "to_dot_bracket",
    "validate_pair_table",
    "is_nested",
    "find_crossing",
    "max_nested_subset",
    "pairs_from_table",
    "table_from_pairs",
    "count_short_hairpins",
    "lonely_pairs",
]

#: Bracket kinds in the order :func:`to_dot_bracket` uses them, one per
#: pseudoknot "page": ``()`` first, then ``[]``, ``{}``, ``<>``, ``Aa`` ... ``Zz``.
BRACKETS: tuple[tuple[str, str], ...] = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">")) + tuple(
    zip(string.ascii_uppercase, string.ascii_lowercase)
)
_OPENERS = {o: k for k, (o, _) in enumerate(BRACKETS)}
_CLOSERS = {c: k for k, (_, c) in enumerate(BRACKETS)}
UNPAIRED = "."


class StructureError(ValueError):
    """An invalid dot-bracket string or pair table.

    Attributes:
      position: 0-based position the problem was found at (``None`` if it
        concerns the whole structure).
      reason: a short machine-readable tag: ``"bad_character"``,
        ``"pseudoknot_bracket"``, ``"unbalanced"``, ``"out_of_range"``,
        ``"self_pair"``, ``"asymmetric"``, ``"crossing"``, ``"short_hairpin"``,
        ``"conflict"`` (a position in two pairs), ``"lonely_pair"`` or ``"shape"``.
    """

    def __init__(self, message: str, *, position: int | None = None, reason: str = "invalid"):
        super().__init__(message)
        self.position = position
        self.reason = reason


# --------------------------------------------------------------------------- #
# dot-bracket <-> pair table
# --------------------------------------------------------------------------- #


def from_dot_bracket(s: str, *, allow_pseudoknots: bool = False) -> np.ndarray:
    """Parses a dot-bracket string into a pair table (int32, 0-based, -1 unpaired).

    Only ``(``, ``)`` and ``.`` are accepted unless ``allow_pseudoknots=True``,
    which also accepts ``[]{}<>`` and ``Aa``..``Zz`` (each kind matched
    separately, so kinds may cross). Raises :class:`StructureError` naming the
    position of the first offending character: an unknown character, a
    pseudoknot bracket when not allowed, a closing bracket without an opening
    one, or an opening bracket that is never closed (the left-most one).

    >>> from_dot_bracket("(.)").tolist()
    [2, -1, 0]
    >>> from_dot_bracket("([)]", allow_pseudoknots=True).tolist()
    [2, 3, 0, 1]
    >>> from_dot_bracket("(()")
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: unmatched '(' at position 0 (never closed)
    >>> from_dot_bracket("(.)]")
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: pseudoknot bracket ']' at position 3 (pass allow_pseudoknots=True to accept [] {} <> Aa..Zz)
    """
    if not isinstance(s, str):
        raise TypeError(f"from_dot_bracket expects a str, got {type(s).__name__}")
    pt = np.full(len(s), -1, dtype=np.int32)
    stacks: list[list[int]] = [[] for _ in BRACKETS]
    for pos, char in enumerate(s):
        if char == UNPAIRED:
            continue
        kind = _OPENERS.get(char, _CLOSERS.get(char))
        if kind is None:
            raise StructureError(
                f"unexpected character {char!r} at position {pos} of the dot-bracket string",
                position=pos,
                reason="bad_character",
            )
        if kind > 0 and not allow_pseudoknots:
            raise StructureError(
                f"pseudoknot bracket {char!r} at position {pos} "
                "(pass allow_pseudoknots=True to accept [] {} <> Aa..Zz)",
                position=pos,
                reason="pseudoknot_bracket",
            )
        if char in _OPENERS:
            stacks[kind].append(pos)
        elif not stacks[kind]:
            raise StructureError(
                f"unmatched {char!r} at position {pos} (no opening {BRACKETS[kind][0]!r} before it)",
                position=pos,
                reason="unbalanced",
            )
        else:
            partner = stacks[kind].pop()
            pt[partner], pt[pos] = pos, partner
    unclosed = [stack[0] for stack in stacks if stack]
    if unclosed:
        pos = min(unclosed)
        raise StructureError(
            f"unmatched {s[pos]!r} at position {pos} (never closed)", position=pos, reason="unbalanced"
        )
    return pt


def to_dot_bracket(pair_table, *, allow_pseudoknots: bool = False) -> str:
    """Writes a pair table as a dot-bracket string.

    A nested table uses only ``().``. A table with crossing pairs raises
    :class:`StructureError` (naming two crossing pairs) unless
    ``allow_pseudoknots=True``; then the pairs are split into pseudoknot-free
    "pages" by repeatedly taking :func:`max_nested_subset` of what is left:
    the first page is written with ``()``, the next with ``[]``, then ``{}``,
    ``<>``, ``Aa``.. (so the ``()`` part is always a maximum nested subset).
    :func:`from_dot_bracket` inverts it exactly.

    >>> to_dot_bracket([2, -1, 0, -1])
    '(.).'
    >>> to_dot_bracket([2, 3, 0, 1], allow_pseudoknots=True)
    '([)]'
    """
    pt = validate_pair_table(pair_table, nested=not allow_pseudoknots)
    chars = np.full(len(pt), UNPAIRED, dtype="<U1")
    remaining = pt.copy()
    for opener, closer in BRACKETS:
        if not (remaining >= 0).any():
            break
        page = max_nested_subset(remaining)
        opens = np.flatnonzero(page > np.arange(len(page)))
        chars[opens] = opener
        chars[page[opens]] = closer
        remaining[page >= 0] = -1
    else:
        if (remaining >= 0).any():
            raise StructureError(
                f"structure needs more than {len(BRACKETS)} bracket kinds", reason="crossing"
            )
    return "".join(chars.tolist())


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #


def validate_pair_table(pair_table, *, min_hairpin: int | None = None, nested: bool = True) -> np.ndarray:
    """Checks a pair table and returns it as an int32 numpy array.

    Raises :class:`StructureError` (a ``ValueError``) naming the first problem
    found, checked in this order: not a 1-D integer array; a partner out of
    range (not in ``[-1, n)``); a position paired with itself; an asymmetric
    entry (``pt[i] = j`` but ``pt[j] != i``); with ``nested=True`` two crossing
    pairs ``i < k < j < l`` (both named); with ``min_hairpin=m`` a pair with
    ``j - i <= m`` (fewer than ``m`` unpaired bases possible inside it).

    >>> validate_pair_table([1, 0]).tolist()
    [1, 0]
    >>> validate_pair_table([2, -1, 1])
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: asymmetric pair table: position 0 pairs with 2 but position 2 pairs with 1
    >>> validate_pair_table([2, 3, 0, 1])
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: crossing pairs (0, 2) and (1, 3): 0 < 1 < 2 < 3 (a pseudoknot)
    >>> validate_pair_table([4, -1, -1, -1, 0], min_hairpin=3).tolist()
    [4, -1, -1, -1, 0]
    >>> validate_pair_table([3, -1, -1, 0], min_hairpin=3)
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: pair (0, 3) encloses 2 unpaired positions, fewer than min_hairpin=3
    """
    pt = _as_table(pair_table)
    n = len(pt)
    bad = np.flatnonzero((pt < -1) | (pt >= n))
    if bad.size:
        i = int(bad[0])
        raise StructureError(
            f"position {i} has partner {int(pt[i])}, out of range [-1, {n})", position=i, reason="out_of_range"
        )
    idx = np.arange(n)
    bad = np.flatnonzero(pt == idx)
    if bad.size:
        i = int(bad[0])
        raise StructureError(f"position {i} is paired with itself", position=i, reason="self_pair")
    paired = pt >= 0
    bad = np.flatnonzero(paired & (pt[np.where(paired, pt, 0)] != idx))
    if bad.size:
        i = int(bad[0])
        j = int(pt[i])
        raise StructureError(
            f"asymmetric pair table: position {i} pairs with {j} but position {j} pairs with {int(pt[j])}",
            position=i,
            reason="asymmetric",
        )
    if nested:
        crossing = find_crossing(pt)
        if crossing is not None:
            (i, j), (k, l) = crossing
            raise StructureError(
                f"crossing pairs ({i}, {j}) and ({k}, {l}): {i} < {k} < {j} < {l} (a pseudoknot)",
                position=k,
                reason="crossing",
            )
    if min_hairpin is not None:
        bad = np.flatnonzero((pt > idx) & (pt - idx <= min_hairpin))
        if bad.size:
            i = int(bad[0])
            j = int(pt[i])
            raise StructureError(
                f"pair ({i}, {j}) encloses {j - i - 1} unpaired positions, fewer than min_hairpin={min_hairpin}",
                position=i,
                reason="short_hairpin",
            )
    return pt


def _as_table(pair_table) -> np.ndarray:
    pt = np.asarray(pair_table)
    if pt.ndim != 1:
        raise StructureError(f"a pair table must be 1-D, got shape {pt.shape}", reason="shape")
    if pt.size and not np.issubdtype(pt.dtype, np.integer):
        raise StructureError(f"a pair table must hold integers, got dtype {pt.dtype}", reason="shape")
    return pt.astype(np.int32)


def find_crossing(pair_table) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Returns two crossing pairs ``((i, j), (k, l))`` with ``i < k < j < l``, or None.

    Assumes a symmetric table. Scans left to right with a stack of open pairs;
    the first closing position whose partner is not on top of the stack gives
    the two pairs reported.

    >>> find_crossing([2, 3, 0, 1])
    ((0, 2), (1, 3))
    >>> find_crossing([3, 2, 1, 0]) is None
    True
    """
    pt = np.asarray(pair_table).tolist()
    stack: list[int] = []
    for pos, partner in enumerate(pt):
        if partner > pos:
            stack.append(pos)
        elif 0 <= partner < pos:
            if stack[-1] != partner:
                top = stack[-1]
                return (partner, pos), (top, pt[top])
            stack.pop()
    return None


def is_nested(pair_table) -> bool:
    """True if no two pairs of a (symmetric) pair table cross.

    >>> is_nested([3, 2, 1, 0]), is_nested([2, 3, 0, 1])
    (True, False)
    """
    return find_crossing(pair_table) is None


def count_short_hairpins(pair_table, min_hairpin: int = 3) -> int:
    """Number of pairs ``(i, j)`` with ``j - i - 1 < min_hairpin``.

    >>> count_short_hairpins([2, -1, 0, -1])
    1
    """
    pt = np.asarray(pair_table)
    idx = np.arange(len(pt))
    return int(np.count_nonzero((pt > idx) & (pt - idx - 1 < min_hairpin)))


def lonely_pairs(pair_table) -> list[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, stacked on neither ``(i + 1, j - 1)`` nor ``(i - 1, j + 1)``:
    helices of one pair, which RNAfold's ``--noLP`` excludes.

    >>> lonely_pairs(from_dot_bracket("((...))..(...)"))
    [(9, 13)]
    """
    pt = np.asarray(pair_table)
    n = len(pt)
    out = []
    for i in np.flatnonzero(pt > np.arange(n)):
        j = int(pt[i])
        inner = i + 1 < n and pt[i + 1] == j - 1
        outer = i > 0 and j + 1 < n and pt[i - 1] == j + 1
        if not (inner or outer):
            out.append((int(i), j))
    return out


# --------------------------------------------------------------------------- #
# maximum nested subset
# --------------------------------------------------------------------------- #


def max_nested_subset(pair_table) -> np.ndarray:
    """A maximum-cardinality pseudoknot-free subset of the pairs, as a pair table.

    Exact interval dynamic programming over the paired positions only (unpaired
    positions cannot matter): with ``B[a, b]`` the largest number of pairwise
    non-crossing pairs lying inside positions ``a..b-1``,
    ``B[a, b] = max(B[a+1, b], 1 + B[a+1, p] + B[p+1, b])``, the second
    option only when ``a``'s partner ``p`` lies in ``a < p < b``. Time and memory
    O(m^2) for ``m`` paired positions (about 18 MB for the 2,968-nt 23S rRNA).

    Tie-breaking (deterministic): the traceback scans each interval left to
    right and *keeps* the pair opening at the current position whenever some
    optimal solution of the interval contains it. Among optimal subsets this
    prefers pairs with smaller 5' ends. It is the rule used by
    ``shared/data/tools/convert.py``, so the result reproduces the
    ``nested_dot_bracket`` column of ``archiveii.tsv``. A nested input is
    returned unchanged (as a copy).

    >>> max_nested_subset([2, 3, 0, 1]).tolist()
    [2, -1, 0, -1]
    >>> max_nested_subset([5, 3, 4, 1, 2, 0]).tolist()
    [5, 3, -1, 1, -1, 0]
    """
    pt = validate_pair_table(pair_table, nested=False)
    if is_nested(pt):
        return pt.copy()
    positions = np.flatnonzero(pt >= 0)  # compressed coordinates: paired positions only
    m = len(positions)
    rank = np.full(len(pt), -1, dtype=np.int64)
    rank[positions] = np.arange(m)
    partner = rank[pt[positions]]  # partner in compressed coordinates
    best = _nested_dp(partner)
    keep = _nested_traceback(partner, best)
    out = np.full(len(pt), -1, dtype=np.int32)
    for a, p in keep:
        i, j = positions[a], positions[p]
        out[i], out[j] = j, i
    return out


def _nested_dp(partner: np.ndarray) -> np.ndarray:
    """``B[a, b]`` (half-open ``a..b-1``) of :func:`max_nested_subset`, row by row."""
    m = len(partner)
    dtype = np.int16 if m < 2**15 else np.int32
    best = np.zeros((m + 1, m + 1), dtype=dtype)
    for a in range(m - 1, -1, -1):
        best[a, a + 1 :] = best[a + 1, a + 1 :]
        p = partner[a]
        if p > a:
            take = 1 + best[a + 1, p] + best[p + 1, p + 1 :]
            np.maximum(best[a, p + 1 :], take, out=best[a, p + 1 :])
    return best


def _nested_traceback(partner: np.ndarray, best: np.ndarray) -> list[tuple[int, int]]:
    keep = []
    todo = [(0, len(partner))]
    while todo:
        a, b = todo.pop()
        while a < b:
            p = int(partner[a])
            if a < p < b and 1 + best[a + 1, p] + best[p + 1, b] >= best[a + 1, b]:
                keep.append((a, p))
                todo.append((a + 1, p))
                a = p + 1
            else:
                a += 1
    return keep


# --------------------------------------------------------------------------- #
# pair lists
# --------------------------------------------------------------------------- #


def pairs_from_table(pair_table) -> list[tuple[int, int]]:
    """The pairs ``(i, j)`` with ``i < j`` of a pair table, sorted by ``i``.

    >>> pairs_from_table([3, -1, -1, 0])
    [(0, 3)]
    """
    pt = np.asarray(pair_table)
    opens = np.flatnonzero(pt > np.arange(len(pt)))
    return [(int(i), int(pt[i])) for i in opens]


def table_from_pairs(pairs: Iterable[tuple[int, int]], n: int) -> np.ndarray:
    """Builds a pair table of length ``n`` from 0-based pairs (in any order/orientation).

    Raises :class:`StructureError` for a position out of range, a self pair or
    a position that occurs in two pairs. Crossing pairs are allowed (check with
    :func:`is_nested`).

    >>> table_from_pairs([(3, 0)], 4).tolist()
    [3, -1, -1, 0]
    >>> table_from_pairs([(0, 3), (3, 5)], 6)
    Traceback (most recent call last):
    ...
    layers.dotbracket.StructureError: position 3 is in two pairs: (0, 3) and (3, 5)
    """
    pt = np.full(n, -1, dtype=np.int32)
    for i, j in pairs:
        i, j = int(i), int(j)
        for pos in (i, j):
            if not 0 <= pos < n:
                raise StructureError(
                    f"pair ({i}, {j}): position {pos} out of range [0, {n})", position=pos, reason="out_of_range"
                )
        if i == j:
            raise StructureError(f"position {i} is paired with itself", position=i, reason="self_pair")
        for pos, other in ((i, j), (j, i)):
            if pt[pos] >= 0:
                old = tuple(sorted((pos, int(pt[pos]))))
                raise StructureError(
                    f"position {pos} is in two pairs: {old} and {tuple(sorted((pos, other)))}",
                    position=pos,
                    reason="conflict",
                )
        pt[i], pt[j] = j, i
    return pt
