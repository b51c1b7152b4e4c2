"""The float64 Turner 2004 evaluator (layers/energy_reference.py) against ViennaRNA 2.x.

Oracles: ``fc.eval_structure_pt`` (integer dcal/mol, exact) for the energy of a structure,
``fc.eval_loop_pt`` per loop, ViennaRNA's partition function with ``md.pf_smooth = 0`` for the
``pf=True`` energies (brute force over all structures of short sequences, and one structure at a
time on long ones by hard constraints that allow only that structure), read in double precision
from ``fc.exp_matrices`` (``fc.pf()`` returns a C float). Sequences are given to ViennaRNA with U
(it does not read T as U when it looks up special hairpins) and with IUPAC codes as they are (it
reads them as N, like foldax).

The ViennaRNA helpers and case builders (``vienna_*``, ``random_shape``, ``fit_sequence``,
``constructed_cases``, ...) live in tests/vienna_helpers.py, shared with tests/test_energy.py and
tests/test_turner.py.
"""

from __future__ import annotations

import math
import random

import jax
import numpy as np
import pytest

from foldax.layers.alphabet import encode
from foldax.layers.dotbracket import StructureError, from_dot_bracket
from foldax.layers.energy_params import KT, PAIR_INDEX, load_parameter_file, save_parameter_file, turner2004
from foldax.layers.energy_reference import (
    brute_force_ensemble_free_energy,
    enumerate_turner_structures,
    numpy_params,
    reference_free_energy,
    reference_loop_energies,
)
from vienna_helpers import (
    constructed_cases,
    fit_sequence,
    pbacktrack_cases,
    random_shape,
    special_hairpin_cases,
    vienna_ensemble_energy,
    vienna_eval,
    vienna_log_q,
    vienna_md,
    vienna_pf_energy,
    vienna_rna_sequence,
)

jax.config.update("jax_enable_x64", True)

# --------------------------------------------------------------------------- #
# fixtures
# --------------------------------------------------------------------------- #


@pytest.fixture
def RNA():
    """The ViennaRNA module with Turner 2004 loaded (and restored afterwards)."""
    module = pytest.importorskip("RNA")
    module.params_load_RNA_Turner2004()
    yield module
    module.params_load_RNA_Turner2004()


@pytest.fixture(scope="module")
def turner():
    return numpy_params(turner2004(np.float64))


@pytest.fixture(scope="module")
def par_files(tmp_path_factory):
    """Andronescu 2007, Langdon 2018 and Turner 1999 as ViennaRNA writes them (the wheel ships no .par files)."""
    module = pytest.importorskip("RNA")
    folder = tmp_path_factory.mktemp("par")
    files = {}
    for name, load in (
        ("andronescu2007", module.params_load_RNA_Andronescu2007),
        ("langdon2018", module.params_load_RNA_Langdon2018),
        ("turner1999", module.params_load_RNA_Turner1999),
    ):
        load()
        files[name] = folder / f"rna_{name}.par"
        assert module.params_save(str(files[name]))
    module.params_load_RNA_Turner2004()
    return files


def _check_cases(RNA, params, cases, *, loops: bool = False) -> int:
    """Asserts reference == ViennaRNA eval on every case (and per loop if ``loops``)."""
    md = vienna_md(RNA)
    for seq, db in cases:
        fc = RNA.fold_compound(vienna_rna_sequence(seq), md)
        pt = RNA.ptable(db)
        expected = fc.eval_structure_pt(pt) / 100
        got = reference_free_energy(params, seq, db)
        if expected >= 1e5:  # ViennaRNA's INF: a forbidden loop
            assert got == math.inf, (seq, db)
            continue
        assert abs(got - expected) <= 1e-6, (seq, db, got, expected, _loop_diff(RNA, fc, params, seq, db))
        if loops:
            for loop in reference_loop_energies(params, seq, db):
                closing = 0 if loop.pair is None else loop.pair[0] + 1
                assert abs(loop.energy - fc.eval_loop_pt(closing, pt) / 100) <= 1e-6, (seq, db, loop)
    return len(cases)


def _loop_diff(RNA, fc, params, seq, db):
    pt = RNA.ptable(db)
    out = []
    for loop in reference_loop_energies(params, seq, db):
        closing = 0 if loop.pair is None else loop.pair[0] + 1
        vienna = fc.eval_loop_pt(closing, pt) / 100
        if abs(vienna - loop.energy) > 1e-9:
            out.append((loop.kind, loop.pair, loop.energy, vienna))
    return out


# --------------------------------------------------------------------------- #
# eval: reference == fc.eval_structure
# --------------------------------------------------------------------------- #


def test_constructed_loops_match_vienna_eval(RNA, turner):
    rng = random.Random(11)
    cases = constructed_cases(rng) + special_hairpin_cases(turner)
    assert _check_cases(RNA, turner, cases, loops=True) > 400


def test_every_special_hairpin_is_used(RNA, turner):
    """Each special hairpin gets its tabulated energy (not the generic formula) in both."""
    for key, energy in turner["special_hairpins"].items():
        loop = "(" + "." * (len(key) - 2) + ")"
        assert reference_free_energy(turner, key, loop) == pytest.approx(energy + _exterior_of(turner, key), abs=1e-12)
        assert vienna_eval(RNA, key, loop) == pytest.approx(energy + _exterior_of(turner, key), abs=1e-9)


def _exterior_of(params, key):
    t = PAIR_INDEX[encode(key[0])[0], encode(key[-1])[0]]
    return params["terminal_au"] if t >= 2 else 0.0


def test_pbacktrack_sample_matches_vienna_eval(RNA, turner):
    rng = random.Random(3)
    cases = pbacktrack_cases(RNA, rng, [rng.randint(1, 120) for _ in range(30)], 5)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 150)) for _ in range(60))]
    assert _check_cases(RNA, turner, cases) >= 150


@pytest.mark.slow
def test_sweep_2000_structures_lengths_1_to_500(RNA, turner):
    rng = random.Random(2024)
    lengths = [1, 2, 3, 4, 5, 6, 500] + [rng.randint(1, 500) for _ in range(120)]
    cases = pbacktrack_cases(RNA, rng, lengths, 8)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 500)) for _ in range(500))]
    cases += constructed_cases(rng, per_kind=2) + special_hairpin_cases(turner)
    assert _check_cases(RNA, turner, cases) >= 2000


@pytest.mark.parametrize("name", ["andronescu2007", "langdon2018", "turner1999"])
def test_other_parameter_sets_match_vienna_eval(RNA, par_files, name):
    params = numpy_params(load_parameter_file(par_files[name], dtype=np.float64))
    RNA.params_load(str(par_files[name]))
    rng = random.Random(7)
    cases = pbacktrack_cases(RNA, rng, [rng.randint(1, 100) for _ in range(15)], 4)
    cases += constructed_cases(rng)[::3] + special_hairpin_cases(params)
    assert _check_cases(RNA, params, cases) > 200


@pytest.mark.slow
@pytest.mark.parametrize("name", ["andronescu2007", "langdon2018"])
def test_other_parameter_sets_sweep(RNA, par_files, name):
    params = numpy_params(load_parameter_file(par_files[name], dtype=np.float64))
    RNA.params_load(str(par_files[name]))
    rng = random.Random(8)
    cases = pbacktrack_cases(RNA, rng, [rng.randint(1, 400) for _ in range(60)], 6)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 400)) for _ in range(200))]
    cases += constructed_cases(rng)
    assert _check_cases(RNA, params, cases) > 800


def test_random_parameters_round_trip_through_vienna(RNA, tmp_path):
    """Random tables saved as .par and loaded by ViennaRNA: its eval equals the reference on the
    tables foldax reads back (which hold what ViennaRNA derives: int22 N entries, clipped dangles)."""
    params = _random_params(np.random.default_rng(5))
    path = tmp_path / "random.par"
    with pytest.warns(UserWarning):
        save_parameter_file(params, path)
    back = numpy_params(load_parameter_file(path, dtype=np.float64))
    RNA.params_load(str(path))
    rng = random.Random(9)
    cases = constructed_cases(rng)[::2] + [
        (fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(5, 150)) for _ in range(40))
    ]
    assert _check_cases(RNA, back, cases) > 200


def _random_params(rng: np.random.Generator) -> dict:
    """Turner 2004 with every finite entry replaced by a random integer in dcal/mol (so the
    .par format holds it exactly); ninio > max_ninio so that the 2x3 eval/pf difference shows."""
    base = turner2004(np.float64)
    out = {}
    for key, value in base.items():
        if key == "special_hairpins":
            out[key] = {seq: np.float64(rng.integers(-300, 600) / 100) for seq in value}
        elif key == "lxc":
            out[key] = np.float64(value)  # ViennaRNA's reader ignores lxc
        else:
            value = np.asarray(value)
            noise = rng.integers(-400, 400, size=value.shape) / 100
            out[key] = np.where(np.isinf(value), np.inf, noise) if value.ndim else np.float64(noise)
    out["ninio"], out["max_ninio"] = np.float64(1.7), np.float64(1.2)
    for key in ("hairpin", "bulge", "interior"):
        out[key] = np.where(np.isinf(base[key]), np.inf, np.abs(out[key]) + 1.0)
    return out


# --------------------------------------------------------------------------- #
# pf: reference(pf=True) == ViennaRNA's partition function
# --------------------------------------------------------------------------- #


def _brute_force_cases(rng, count, n_max, n_min=1):
    """Random sequences of n_min..n_max nt; every 4th with N, every 5th GC-rich (many structures)."""
    for trial in range(count):
        n = rng.randint(n_min, n_max)
        letters = "ACGUN" if trial % 4 == 0 else "GGCCAU" if trial % 5 == 0 else "ACGU"
        yield "".join(rng.choice(letters) for _ in range(n))


def _assert_close_energy(got, expected, rel=1e-9):
    # G = -kT ln Q; ln Q compared at 1e-9 relative (absolute near 0, where ln Q -> 0)
    assert abs(got - expected) / KT <= rel * max(1.0, abs(expected) / KT), (got, expected)


def test_brute_force_partition_function_matches_vienna(RNA, turner):
    rng = random.Random(1)
    for seq in _brute_force_cases(rng, 25, 14):
        _assert_close_energy(brute_force_ensemble_free_energy(turner, seq), vienna_ensemble_energy(RNA, seq))


@pytest.mark.slow
def test_brute_force_partition_function_up_to_18(RNA, turner):
    rng = random.Random(2)
    for seq in _brute_force_cases(rng, 60, 18, n_min=12):
        _assert_close_energy(brute_force_ensemble_free_energy(turner, seq), vienna_ensemble_energy(RNA, seq))


def test_brute_force_with_other_parameter_sets(RNA, par_files):
    rng = random.Random(4)
    for path in par_files.values():
        params = numpy_params(load_parameter_file(path, dtype=np.float64))
        RNA.params_load(str(path))
        for seq in _brute_force_cases(rng, 6, 13):
            _assert_close_energy(brute_force_ensemble_free_energy(params, seq), vienna_ensemble_energy(RNA, seq))


def test_enumeration_counts_match_vienna(RNA):
    """The enumerated folding space is ViennaRNA's: the structures its subopt lists with an
    unbounded energy band."""
    rng = random.Random(6)
    for seq in _brute_force_cases(rng, 8, 12):
        fc = RNA.fold_compound(seq, vienna_md(RNA))
        subopt = {s.structure for s in fc.subopt(100000)}
        ours = set()
        for pairs in enumerate_turner_structures(seq):
            db = ["."] * len(seq)
            for i, j in pairs:
                db[i], db[j] = "(", ")"
            ours.add("".join(db))
        assert ours == subopt, seq


def test_pf_energy_of_single_structures(RNA, turner):
    """pf=True equals the energy ViennaRNA's partition function gives each structure, including
    hairpins longer than 30 (untruncated extrapolation) where it differs from eval."""
    rng = random.Random(12)
    cases = [
        (fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(5, 250), max_loop=30) for _ in range(25))
    ]
    cases += [(fit_sequence(rng, db), db) for db in ("(((" + "." * u + ")))" for u in (31, 32, 33, 40, 61, 150))]
    differ = 0
    for seq, db in cases:
        got = reference_free_energy(turner, seq, db, pf=True)
        assert abs(got - vienna_pf_energy(RNA, seq, db)) <= 1e-9 * max(1.0, abs(got)), (seq, db)
        differ += abs(got - reference_free_energy(turner, seq, db)) > 1e-9
    assert differ >= 6  # the long hairpins


def test_pf_energy_2x3_ninio_cap(RNA, tmp_path):
    """With ninio > max_ninio the pf caps the 2x3 ninio term and eval does not."""
    params = _random_params(np.random.default_rng(13))
    path = tmp_path / "ninio.par"
    with pytest.warns(UserWarning):
        save_parameter_file(params, path)
    back = numpy_params(load_parameter_file(path, dtype=np.float64))
    RNA.params_load(str(path))
    rng = random.Random(14)
    for shape in ("((..((...))...))", "((...((...))..))", "(((...((((...))))..)))", "(..((.....))...)"):
        seq = fit_sequence(rng, shape, odd_rate=0.0)
        ev, pf = reference_free_energy(back, seq, shape), reference_free_energy(back, seq, shape, pf=True)
        assert ev == pytest.approx(vienna_eval(RNA, seq, shape), abs=1e-9)
        assert pf == pytest.approx(vienna_pf_energy(RNA, seq, shape), abs=1e-9)
        assert ev - pf == pytest.approx(back["ninio"] - back["max_ninio"], abs=1e-9)


def test_soft_constraint_semantics(RNA, turner):
    """fc.sc_add_bp(i+1, j+1, e) adds e once per occurrence of (i, j): eval, and the pf equals the
    brute force with phi[i, j] = -e / kT (what the issue's phi tests rely on)."""
    rng = random.Random(15)
    for seq in _brute_force_cases(rng, 6, 13):
        x = encode(seq)
        n = len(seq)
        phi = np.zeros((n, n))
        fc = RNA.fold_compound(seq, vienna_md(RNA))
        for i in range(n):
            for j in range(i + 4, n):
                if PAIR_INDEX[x[i], x[j]] >= 0 and rng.random() < 0.4:
                    e = rng.randint(-300, 300) / 100
                    fc.sc_add_bp(i + 1, j + 1, e)
                    phi[i, j] = -e / KT
        for pairs in list(enumerate_turner_structures(seq))[:40]:
            db = ["."] * n
            for i, j in pairs:
                db[i], db[j] = "(", ")"
            expected = reference_free_energy(turner, seq, list(pairs)) - KT * sum(phi[i, j] for i, j in pairs)
            assert fc.eval_structure_pt(RNA.ptable("".join(db))) / 100 == pytest.approx(expected, abs=1e-9)
        fc.pf()
        _assert_close_energy(
            brute_force_ensemble_free_energy(turner, seq, phi=phi), -fc.exp_params.kT / 1000 * vienna_log_q(fc)
        )


# --------------------------------------------------------------------------- #
# inputs and edge cases
# --------------------------------------------------------------------------- #


def test_structure_forms_and_sequence_letters_agree(turner):
    db = "..((((...))..)).(((....)))"
    seq = "AGGCGCAAAGCAAGCCUGGGAAACCC"
    pt = from_dot_bracket(db)
    pairs = [(i, int(j)) for i, j in enumerate(pt) if j > i]
    energy = reference_free_energy(turner, seq, db)
    assert reference_free_energy(turner, seq, pt) == energy
    assert reference_free_energy(turner, seq, pairs) == energy
    assert reference_free_energy(turner, encode(seq), db) == energy
    assert reference_free_energy(turner, seq.lower().replace("u", "t"), db) == energy
    # IUPAC codes read as N: the same energy as with N
    odd = seq[:7] + "R" + seq[8:]
    assert reference_free_energy(turner, odd, db) == reference_free_energy(turner, seq[:7] + "N" + seq[8:], db)


def test_empty_and_unpaired(turner):
    assert reference_free_energy(turner, "", "") == 0.0
    assert reference_free_energy(turner, "ACGUN", ".....") == 0.0
    assert reference_free_energy(turner, "ACGUN", []) == 0.0


def test_forbidden_structures_are_infinite(turner):
    assert reference_free_energy(turner, "GGAACC", "((..))") == math.inf  # hairpin of 2
    assert reference_free_energy(turner, "GAAAAA", "(....)") == math.inf  # G-A
    assert reference_free_energy(turner, "GNAAAC", ".(...)") == math.inf  # N pairs with nothing
    assert reference_free_energy(turner, "GGAAAACA", "((....))") == math.inf  # inner G-A


def test_bad_structures_raise(turner):
    with pytest.raises(StructureError):
        reference_free_energy(turner, "GGGAAACCC", "(((...))")
    with pytest.raises(ValueError, match="length"):
        reference_free_energy(turner, "GGGAAACCC", "((....))")
    with pytest.raises(StructureError, match="crossing"):
        reference_free_energy(turner, "GGGGAAAACCCC", [(0, 8), (4, 11)])
    with pytest.raises(ValueError, match="invalid nucleotide"):
        reference_free_energy(turner, "GGXAAACCC", ".........")


def test_large_loop_truncation_matches_vienna_for_every_length(RNA, turner):
    """trunc(100 lxc ln(n/30)) in float64 equals ViennaRNA's int cast for every loop length
    that matters (checked through hairpins, bulges and interior loops of 31..600)."""
    rng = random.Random(16)
    cases = []
    for u in range(31, 601, 7):
        cases.append((fit_sequence(rng, "((" + "." * u + "))", odd_rate=0), "((" + "." * u + "))"))
        cases.append((fit_sequence(rng, "((" + "." * u + "(((...)))))", odd_rate=0), "((" + "." * u + "(((...)))))"))
        cases.append(
            (
                fit_sequence(rng, "((" + "." * (u - 2) + "(((...)))..))", odd_rate=0),
                "((" + "." * (u - 2) + "(((...)))..))",
            )
        )
    assert _check_cases(RNA, turner, cases) == len(cases)
