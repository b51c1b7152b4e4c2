"""ViennaRNA oracles and test-case builders shared by the Turner-model tests.

Used by tests/test_energy_reference.py (float64 reference evaluator), tests/test_energy.py
(JAX loop evaluator) and tests/test_turner.py (the DP through the public API). Sequences go to
ViennaRNA upper-cased with T -> U (it does not read T as U when it looks up special hairpins)
and with IUPAC codes as they are (it reads them as N, like foldax). Every ViennaRNA model here is
``vienna_md``: ``RNA.md()`` defaults with ``pf_smooth = 0`` (foldax's partition function clips
the dangle tables like ViennaRNA's energy evaluation; ``pf_smooth = 1`` smooths them) and
``uniq_ML = 1`` (needed by ``fc.pbacktrack``).
"""

from __future__ import annotations

import math
import random

import numpy as np

from foldax.layers.dotbracket import from_dot_bracket

CANONICAL = ("CG", "GC", "GU", "UG", "AU", "UA")
IUPAC = "NRYKMSWBDHV"

def vienna_md(RNA, *, pf_smooth=0):
    md = RNA.md()
    md.uniq_ML = 1  # needed by fc.pbacktrack
    md.pf_smooth = pf_smooth
    return md


def vienna_rna_sequence(seq: str) -> str:
    """What to give ViennaRNA for a foldax sequence: upper case, T -> U (IUPAC codes stay)."""
    return seq.upper().replace("T", "U")


def vienna_eval(RNA, seq: str, db: str, md=None) -> float:
    """ViennaRNA's energy of ``db`` in kcal/mol, exact (integer dcal/mol / 100)."""
    fc = RNA.fold_compound(vienna_rna_sequence(seq), md or vienna_md(RNA))
    return fc.eval_structure_pt(RNA.ptable(db)) / 100


def vienna_log_q(fc) -> float:
    """ln Q of a fold compound after ``fc.pf()``, in double precision.

    ``fc.pf()`` returns G as a C float (~1e-8 relative); Q = q1k[n] * pf_scale^n exactly, read
    as a sum of logs because pf_scale^n over/underflows a double for long sequences (ViennaRNA's
    ``scale[n]`` is 0 at n = 2,000)."""
    n = fc.length
    return math.log(fc.exp_matrices.q1k[n]) + n * math.log(fc.exp_params.pf_scale)


def vienna_ensemble_energy(RNA, seq: str, md=None) -> float:
    """-kT ln Q (kcal/mol) of ViennaRNA's partition function, in double precision."""
    fc = RNA.fold_compound(vienna_rna_sequence(seq), md or vienna_md(RNA))
    fc.pf()
    return -fc.exp_params.kT / 1000 * vienna_log_q(fc)


def vienna_pf_energy(RNA, seq: str, db: str, md=None) -> float:
    """The energy ViennaRNA's partition function gives the single structure ``db``: its pf over
    the hard constraints that allow nothing but ``db``."""
    fc = RNA.fold_compound(vienna_rna_sequence(seq), md or vienna_md(RNA))
    fc.hc_add_from_db(db.replace(".", "x"), RNA.CONSTRAINT_DB_DEFAULT | RNA.CONSTRAINT_DB_ENFORCE_BP)
    fc.pf()
    return -fc.exp_params.kT / 1000 * vienna_log_q(fc)


def _loop_sizes(rng: random.Random, available: int, max_loop: int | None) -> tuple[int, int]:
    """Unpaired sizes (n1, n2) of an interior loop/bulge: mostly small, sometimes large."""
    cap = available if max_loop is None else min(available, max_loop)
    roll = rng.random()
    if roll < 0.25:
        n1, n2 = rng.choice([(0, 1), (1, 0), (1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 2)])
    elif roll < 0.5:
        n1, n2 = rng.randint(0, 1), rng.randint(3, 8)
        n1, n2 = (n1, n2) if rng.random() < 0.5 else (n2, n1)
    elif roll < 0.9:
        n1, n2 = rng.randint(0, 6), rng.randint(0, 6)
    else:
        n1, n2 = rng.randint(0, 40), rng.randint(0, 40)
    while n1 + n2 > cap:
        n1, n2 = n1 // 2, n2 // 2
    return n1, n2  # (0, 0) is a stacked pair


def random_shape(rng: random.Random, n: int, *, max_loop: int | None = None) -> str:
    """A random dot-bracket string of length ``n`` (hairpins >= 3) with every kind of loop:
    stacks, bulges, 1x1..2x3, 1xn and generic interior loops (larger than 30 unless ``max_loop``),
    multiloops with 0..several unpaired bases between branches, stems at the sequence ends."""

    def region(m: int, min_stems: int = 0) -> str:
        """m positions holding unpaired runs and stems (at least min_stems if room)."""
        out, left, stems = [], m, 0
        while left > 0:
            if left < 5 or (stems >= min_stems and rng.random() < 0.15):
                run = left if left < 5 else rng.randint(0, min(left, 4))
                out.append("." * run)
                left -= run
                if left < 5:
                    out.append("." * left)
                    break
                continue
            gap = rng.choice([0, 0, 1, 2, 3]) if left > 8 else 0
            gap = min(gap, left - 5)
            out.append("." * gap)
            left -= gap
            reserve = 5 * max(0, min_stems - stems - 1)
            size = (
                rng.randint(5, max(5, left - reserve))
                if rng.random() < 0.5
                else min(left - reserve, rng.randint(5, 40))
            )
            size = max(5, min(size, left))
            out.append(stem(size))
            left -= size
            stems += 1
        return "".join(out)

    def stem(m: int) -> str:
        """A pair enclosing m - 2 positions."""
        inside = m - 2
        roll = rng.random()
        if inside < 5 or roll < 0.12:
            return "(" + "." * inside + ")"  # hairpin (long ones included)
        if roll < 0.5:
            return "(" + stem(inside) + ")"  # stacked pair
        if roll < 0.8 or inside < 12:
            n1, n2 = _loop_sizes(rng, inside - 5, max_loop)
            return "(" + "." * n1 + stem(inside - n1 - n2) + "." * n2 + ")"
        return "(" + region(inside, min_stems=2) + ")"  # multiloop

    db = region(n)
    assert len(db) == n, (n, db)
    return db


def fit_sequence(rng: random.Random, db: str, *, odd_rate: float = 0.05) -> str:
    """A sequence on which ``db`` has canonical pairs only; unpaired bases random over ACGU and,
    at ``odd_rate``, N or another IUPAC code (or T for U, lower case)."""
    pt = from_dot_bracket(db)
    seq = [""] * len(db)
    for i, j in enumerate(pt.tolist()):
        if j > i:
            seq[i], seq[j] = rng.choice(CANONICAL)
        elif j < 0:
            seq[i] = rng.choice(IUPAC) if rng.random() < odd_rate else rng.choice("ACGU")
    if rng.random() < 0.1:
        seq = [c.lower() if rng.random() < 0.3 else c for c in seq]
    if rng.random() < 0.1:
        seq = ["T" if c == "U" else c for c in seq]
    return "".join(seq)


def special_hairpin_cases(params) -> list[tuple[str, str]]:
    """Every special hairpin alone, inside a helix, and with unpaired flanks."""
    cases = []
    for key in params["special_hairpins"]:
        loop = "(" + "." * (len(key) - 2) + ")"
        cases += [(key, loop), ("GC" + key + "GC", "((" + loop + "))"), ("A" + key + "UAG", "." + loop + "...")]
        cases.append(("AGU" + key + "ACU", ".((" + loop + "))."))
    return cases


def constructed_cases(rng: random.Random, *, max_loop: int | None = None, per_kind: int = 1) -> list[tuple[str, str]]:
    """(sequence, structure) pairs built to hit every loop type: hairpins 3..40 and 100, every
    interior-loop size (n1, n2) in 0..8 x 0..8 plus large and asymmetric ones, multiloops with
    2..5 branches and 0..3 unpaired bases between them, exterior stems at either end or both."""
    shapes = []
    for u in list(range(3, 41)) + [64, 100]:
        shapes += ["((" + "." * u + "))", "." + "(" + "." * u + ")", "(" + "." * u + ")" + ".."]
    sizes = [(a, b) for a in range(9) for b in range(9)] + [
        (0, 29),
        (0, 30),
        (0, 31),
        (0, 45),
        (1, 29),
        (29, 1),
        (1, 30),
        (30, 1),
        (15, 15),
        (16, 15),
        (20, 25),
        (1, 40),
    ]
    for n1, n2 in sizes:
        if max_loop is not None and n1 + n2 > max_loop:
            continue
        shapes.append("((" + "." * n1 + "((...))" + "." * n2 + "))")
        shapes.append("." + "(" + "." * n1 + "(((....)))" + "." * n2 + ")" + ".")
    for branches in range(2, 6):
        for gap in range(4):
            inner = ("." * gap).join(["((...))"] * branches)
            shapes += ["(" + "." * gap + inner + "." * gap + ")", "(" + inner + ")..", "((" + "." + inner + "))"]
    shapes += ["(...)(...)", "(...).(...)", "..(...)..(...)..", "((...))((...))", "(((...)))"]
    cases = []
    for shape in shapes:
        for _ in range(per_kind):
            cases.append((fit_sequence(rng, shape), shape))
    return cases


def pbacktrack_cases(RNA, rng: random.Random, lengths, samples: int, md=None) -> list[tuple[str, str]]:
    """Structures drawn from ViennaRNA's Boltzmann ensemble of random sequences."""
    cases = []
    for n in lengths:
        letters = "ACGU" if rng.random() < 0.7 else "ACGUACGUN"
        seq = "".join(rng.choice(letters) for _ in range(n))
        fc = RNA.fold_compound(seq, md or vienna_md(RNA))
        fc.pf()
        cases += [(seq, db) for db in fc.pbacktrack(samples)]
    return cases


# --------------------------------------------------------------------------- #
# whole-sequence oracles: MFE, partition function, pair probabilities
# --------------------------------------------------------------------------- #


def vienna_fold_compound(RNA, seq: str, md=None, *, soft_pairs=()):
    """``(fc, mfe structure, mfe in kcal/mol)`` with the partition function computed.

    ``soft_pairs``: ``(i, j, e)`` with 0-based ``i < j`` and ``e`` in kcal/mol, added as
    ``fc.sc_add_bp(i + 1, j + 1, e)`` before folding. The Boltzmann factors are rescaled from the
    MFE (``fc.exp_params_rescale``) so that long sequences neither over- nor underflow."""
    fc = RNA.fold_compound(vienna_rna_sequence(seq), md or vienna_md(RNA))
    for i, j, e in soft_pairs:
        fc.sc_add_bp(i + 1, j + 1, e)
    structure, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    fc.pf()
    return fc, structure, mfe


def vienna_pf_result(fc) -> float:
    """G = -kT ln Q (kcal/mol) of a fold compound after ``fc.pf()``, in double precision."""
    return -fc.exp_params.kT / 1000 * vienna_log_q(fc)


def vienna_bpp(fc) -> np.ndarray:
    """The pair probabilities of a fold compound after ``fc.pf()`` as a symmetric 0-based
    ``[n, n]`` float64 matrix (``fc.bpp()`` is 1-based, upper triangle)."""
    n = fc.length
    upper = np.asarray(fc.bpp(), dtype=np.float64)[1 : n + 1, 1 : n + 1]
    upper = np.triu(upper, 1)
    return upper + upper.T


def dot_bracket(pairs, n: int) -> str:
    """0-based pairs (i, j) -> a dot-bracket string of length n."""
    db = ["."] * n
    for i, j in pairs:
        db[i], db[j] = "(", ")"
    return "".join(db)


def save_vienna_parameter_sets(RNA, folder, names=("Andronescu2007", "Langdon2018", "Turner1999")) -> dict:
    """ViennaRNA's built-in parameter sets written by ``RNA.params_save`` (the wheel ships no
    .par files): ``{name: path}``. Leaves Turner 2004 loaded."""
    files = {}
    try:
        for name in names:
            getattr(RNA, f"params_load_RNA_{name}")()
            files[name] = folder / f"rna_{name.lower()}.par"
            assert RNA.params_save(str(files[name])), name
    finally:
        RNA.params_load_RNA_Turner2004()
    return files
