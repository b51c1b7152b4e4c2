"""Nucleotide alphabet: strings <-> int32 token arrays.

Tokens: ``A=0, C=1, G=2, U=3, N=4``. Letters are case-insensitive, ``T`` reads as
``U`` and the IUPAC ambiguity codes ``R Y K M S W B D H V`` (and ``N``) read as
``N``. Any other character is an error naming the character and its position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ALPHABET = "ACGUN"
NUM_TOKENS = 5
N_TOKEN = 4
#: Token written into the padding of a batch (content beyond a sequence's length
#: never changes any result, see ``log_partition``).
PAD_TOKEN = N_TOKEN
#: Default static lengths a batch is padded up to (one compiled program each).
DEFAULT_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

_LOOKUP = np.full(256, -1, dtype=np.int32)
for _letters, _token in (("A", 0), ("C", 1), ("G", 2), ("UT", 3), ("NRYKMSWBDHV", 4)):
    for _c in _letters:
        _LOOKUP[ord(_c)] = _token
        _LOOKUP[ord(_c.lower())] = _token


def encode(seq: str) -> np.ndarray:
    """Encodes a nucleotide string as int32 tokens.

    >>> encode("acgTn-").tolist()
    Traceback (most recent call last):
    ...
    ValueError: invalid nucleotide '-' at position 5 of the sequence (allowed: A C G U T N and IUPAC codes R Y K M S W B D H V)
    >>> encode("acgTr").tolist()
    [0, 1, 2, 3, 4]
    """
    if not isinstance(seq, str):
        raise TypeError(f"encode expects a str, got {type(seq).__name__}")
    raw = np.frombuffer(seq.encode("utf-8", errors="replace"), dtype=np.uint8)
    if len(raw) != len(seq):  # non-ASCII: find the first offending character
        for pos, char in enumerate(seq):
            if ord(char) > 127:
                _raise_invalid(char, pos)
    tokens = _LOOKUP[raw]
    bad = np.flatnonzero(tokens < 0)
    if bad.size:
        _raise_invalid(seq[bad[0]], int(bad[0]))
    return tokens.astype(np.int32)


def _raise_invalid(char: str, pos: int):
    raise ValueError(
        f"invalid nucleotide {char!r} at position {pos} of the sequence "
        "(allowed: A C G U T N and IUPAC codes R Y K M S W B D H V)"
    )


def decode(tokens) -> str:
    """Tokens back to a string over ``ACGUN``."""
    return "".join(ALPHABET[t] for t in np.asarray(tokens).tolist())


def bucket_length(n: int, buckets: Sequence[int] | None = DEFAULT_BUCKETS) -> int:
    """The smallest bucket >= n (or n itself when ``buckets`` is None or too small)."""
    if buckets:
        for b in buckets:
            if b >= n:
                return int(b)
    return int(n)


def encode_batch(seqs: Sequence[str], *, buckets: Sequence[int] | None = DEFAULT_BUCKETS):
    """Encodes several sequences into one padded batch.

    Returns ``(tokens int32 [B, L], lengths int32 [B])``. ``L`` is the longest
    length rounded up to the next entry of ``buckets`` (pass ``buckets=None`` for
    no rounding), so that batches of similar lengths share one compiled program.
    Padding positions hold ``PAD_TOKEN`` (4, 'N'); they never change a result.

    >>> tokens, lengths = encode_batch(["ACGU", "GG"], buckets=None)
    >>> tokens.tolist(), lengths.tolist()
    ([[0, 1, 2, 3], [2, 2, 4, 4]], [4, 2])
    """
    if isinstance(seqs, str):
        raise TypeError("encode_batch expects a sequence of strings, not one string")
    encoded = []
    for index, seq in enumerate(seqs):
        try:
            encoded.append(encode(seq))
        except ValueError as err:
            raise ValueError(f"sequence {index}: {err}") from None
    lengths = np.array([len(e) for e in encoded], dtype=np.int32)
    width = bucket_length(int(lengths.max(initial=0)), buckets)
    tokens = np.full((len(encoded), width), PAD_TOKEN, dtype=np.int32)
    for row, e in zip(tokens, encoded):
        row[: len(e)] = e
    return tokens, lengths
