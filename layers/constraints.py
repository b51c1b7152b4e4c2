"""Hard structure constraints in RNAfold's notation (``RNAfold -C``), as pair scores ``phi``.

A constraint string has one symbol per nucleotide (RNAfold's ``-C``):

* ``.`` no constraint; ``x`` unpaired;
* ``<`` paired with a later nucleotide, or unpaired; ``>`` paired with an earlier one, or unpaired;
* matching ``(`` ``)``: i pairs with j or stays unpaired, j likewise, and no pair crosses (i, j);
* ``|`` (must pair): no effect, as in ``RNAfold -C`` without ``--enforceConstraint``, where ViennaRNA
  ignores it (its ``hc_add_from_db(..., CONSTRAINT_DB_DEFAULT)``; :func:`must_pair_positions` names
  such positions so that a caller can say so).

With ``enforce=True`` (``RNAfold -C --enforceConstraint``, ViennaRNA's ``CONSTRAINT_DB_ENFORCE_BP``)
each ``( )`` pair must form and each ``|`` must pair; ``<`` and ``>`` stay as above, as in ViennaRNA.
A requirement is not a forbidden pair, so :func:`constraint_phi` expresses it as a bonus: every pair
that meets ``e`` of the ``E`` enforced elements (a ``( )`` pair itself; a pair of a ``|`` position)
gets ``e`` x :data:`ENFORCE_BONUS`. A structure meeting all of them then weighs ``E B`` more than
itself, any other at least ``B`` less than that, so the ensemble is the enforced one up to a relative
``e^-B`` (times how much likelier the structures that miss an element are): ``log Z`` and the best
score are :func:`enforced_bonus` too high, pair probabilities and structures are the enforced ones.

Every constraint forbids pairs, and nothing else, so it is a ``phi`` that is
:data:`~foldax.layers.FORBIDDEN_PHI` on the forbidden pairs and 0 elsewhere: the partition function,
pair probabilities, best structure and samples of any grammar are then those of the constrained
ensemble. ViennaRNA's default hard constraints are the same ensemble
(``tests/test_constraints.py`` checks pf, MFE and pair probabilities against them). ViennaRNA also
lets ``( )`` name a pair that cannot pair canonically (with its non-standard pair energies);
foldax's grammars have no such pair, so :func:`constraint_phi` refuses it when given the sequence.
"""

from __future__ import annotations

import numpy as np

from foldax.layers.alphabet import encode
from foldax.layers.energy_params import PAIR_INDEX
from foldax.layers.free_energy import FORBIDDEN_PHI

__all__ = ["CONSTRAINT_SYMBOLS", "ENFORCE_BONUS", "allowed_pairs", "check_constraint", "constraint_phi",
           "enforced_bonus", "must_pair_positions"]

#: The symbols of a constraint string (RNAfold's ``-C``).
CONSTRAINT_SYMBOLS = ".x|<>()"
#: The log-weight bonus of one enforced element (``enforce=True``): e^-100 ~ 4e-44 leaves the
#: structures that miss an element out of the ensemble unless they are ~e^60 likelier (a 37 kcal/mol
#: advantage at 37 C), while a float32 log Z of a few enforced elements keeps its precision.
ENFORCE_BONUS = 100.0


def _scan(constraint: str) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The matched ``( )`` of ``constraint`` (0-based) and each position's region: the ``(`` of the
    innermost constraint pair strictly around it (-1: none; a pair's own brackets lie in the region
    around that pair). ValueError naming a bad symbol or bracket."""
    opened, pairs = [], []
    region = np.full(len(constraint), -1)
    for pos, symbol in enumerate(constraint):
        if symbol not in CONSTRAINT_SYMBOLS:
            raise ValueError(f"constraint: unknown symbol {symbol!r} at position {pos + 1} (1-based; allowed: "
                             f"{' '.join(CONSTRAINT_SYMBOLS)})")
        if symbol == ")":
            if not opened:
                raise ValueError(f"constraint: ')' at position {pos + 1} (1-based) closes no '('")
            pairs.append((opened.pop(), pos))
        region[pos] = opened[-1] if opened else -1
        if symbol == "(":
            opened.append(pos)
    if opened:
        raise ValueError(f"constraint: '(' at position {opened[-1] + 1} (1-based) is never closed")
    return sorted(pairs), region


def allowed_pairs(constraint: str) -> np.ndarray:
    """``[n, n]`` bool: ``allowed[i, j]`` (both triangles) is False where the constraint forbids pair (i, j).

    A pair crosses no constraint pair exactly when both its ends lie in the same region (inside
    the same innermost constraint pair, or outside all), so one comparison holds every ``( )``.

    >>> allowed = allowed_pairs("x.<..>")
    >>> bool(allowed[0, 5]), bool(allowed[2, 5]), bool(allowed[1, 2]), bool(allowed[2, 4])
    (False, True, False, True)
    >>> bool(allowed_pairs("(.)..")[1, 4])  # crosses the constraint pair (0, 2)
    False
    """
    pairs, region = _scan(constraint)
    n = len(constraint)
    symbols = np.array(list(constraint), dtype="<U1") if n else np.zeros(0, "<U1")
    partner = np.full(n, -1)
    for a, b in pairs:
        partner[a], partner[b] = b, a
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    # (i, j) with i < j: i is the 5' end, j the 3' end.
    five, three = symbols[:, None], symbols[None, :]
    ok = (i < j) & (five != "x") & (three != "x") & (five != ">") & (three != "<")
    ok &= region[:, None] == region[None, :]
    # A bracketed base pairs with its partner only.
    bracketed = partner >= 0
    ok &= ~(bracketed[:, None] | bracketed[None, :]) | (partner[:, None] == j)
    return ok | ok.T


def must_pair_positions(constraint: str) -> list[int]:
    """0-based positions marked ``|`` (must pair), which the constraint does not enforce.

    >>> must_pair_positions("..|.|")
    [2, 4]
    """
    return [pos for pos, symbol in enumerate(constraint) if symbol == "|"]


def check_constraint(constraint: str, sequence: str | None = None) -> None:
    """ValueError naming what is wrong with ``constraint`` (a symbol, a bracket; with ``sequence``, a
    length that differs or a ``( )`` of nucleotides that cannot pair: canonical pairs AU, GC, GU).

    >>> check_constraint("(...)", "GGACA")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: constraint pairs positions 1 and 5 (1-based), G-A, which cannot pair ...
    """
    if sequence is not None and len(sequence) != len(constraint):
        raise ValueError(f"constraint has length {len(constraint)} but the sequence has {len(sequence)}")
    pairs, _ = _scan(constraint)
    if sequence is None:
        return
    tokens = np.asarray(encode(sequence))
    for a, b in pairs:
        if PAIR_INDEX[tokens[a], tokens[b]] < 0:
            raise ValueError(
                f"constraint pairs positions {a + 1} and {b + 1} (1-based), {sequence[a]}-{sequence[b]}, "
                f"which cannot pair (canonical pairs: AU GC GU); RNAfold allows it with non-standard pair "
                f"energies, foldax's grammars have no such pair")


def _enforced(constraint: str) -> tuple[list[tuple[int, int]], list[int]]:
    pairs, _ = _scan(constraint)
    return pairs, must_pair_positions(constraint)


def enforced_bonus(constraint: str, structure=None) -> float:
    """What ``constraint_phi(constraint, enforce=True)`` adds to a log-weight: :data:`ENFORCE_BONUS`
    times the number of enforced elements (``( )`` pairs and ``|`` positions), or with ``structure``
    (a pair table or dot-bracket) the number of them it meets. Subtract it from ``log_partition``
    (all of them) and from a structure's ``max_score`` / ``structure_score`` (those it meets).

    >>> enforced_bonus("(|..)"), enforced_bonus("(|..)", "(...)"), enforced_bonus("(|..)", "((.))")
    (200.0, 100.0, 200.0)
    """
    pairs, bars = _enforced(constraint)
    if structure is None:
        return ENFORCE_BONUS * (len(pairs) + len(bars))
    if isinstance(structure, str):
        from foldax.layers.dotbracket import from_dot_bracket

        structure = from_dot_bracket(structure)
    partner = np.asarray(structure)
    met = sum(1 for a, b in pairs if partner[a] == b) + sum(1 for p in bars if partner[p] >= 0)
    return ENFORCE_BONUS * met


def constraint_phi(constraint: str, sequence: str | None = None, *, length: int | None = None,
                   dtype=np.float32, enforce: bool = False) -> np.ndarray:
    """The ``phi`` of a hard constraint: ``[n, n]`` (or ``[length, length]``, zero-padded for a batch),
    :data:`~foldax.layers.FORBIDDEN_PHI` on the pairs it forbids and 0 elsewhere; with ``enforce``,
    also the bonus of the pairs that meet enforced elements (module docstring; :func:`enforced_bonus`).

    With ``sequence``, it is checked against it first (:func:`check_constraint`).

    >>> from foldax import layers
    >>> seq = "GGGGAAACCCCAUGGAAACCAU"
    >>> x = layers.encode(seq)
    >>> free = float(layers.ensemble_free_energy(layers.turner2004(), x))
    >>> held = float(layers.ensemble_free_energy(layers.turner2004(), x, phi=constraint_phi("x" * 11 + "." * 11, seq)))
    >>> held > free
    True
    >>> layers.to_dot_bracket(layers.best_structure(layers.turner2004(), x,
    ...                                             phi=constraint_phi("x" * 11 + "." * 11, seq)))
    '...........((((...))))'
    """
    check_constraint(constraint, sequence)
    n = len(constraint)
    size = n if length is None else length
    if size < n:
        raise ValueError(f"constraint has length {n}, longer than length={size}")
    phi = np.zeros((size, size), dtype)
    allowed = allowed_pairs(constraint)
    phi[:n, :n] = np.where(allowed, 0.0, FORBIDDEN_PHI)
    if enforce:
        pairs, bars = _enforced(constraint)
        met = np.zeros((n, n))
        for a, b in pairs:
            met[a, b] += 1
        bar = np.zeros(n)
        bar[bars] = 1
        met += bar[:, None] + bar[None, :]
        met = np.triu(met, 1)
        phi[:n, :n] += np.where(allowed, ENFORCE_BONUS * (met + met.T), 0.0).astype(dtype)
    return phi
