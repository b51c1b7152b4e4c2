"""RNAfold's model options on the Turner parameters, checked against ViennaRNA with the same option
(``pf_smooth = 0`` as everywhere in foldax):

* ``-T``: folding away from 37 C, the energies rescaled from their enthalpies (``md.temperature``);
* ``-d0``: no dangle or mismatch energies on multiloop and exterior stems (``md.dangles = 0``).
"""

from __future__ import annotations

import math
import random
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax import layers
from foldax.layers import energy_params as ep
from foldax.layers.energy_reference import brute_force_ensemble_free_energy
from vienna_helpers import vienna_md

TEMPERATURES = (0.0, 24.5, 50.0, 75.0)


@pytest.fixture(scope="module")
def RNA():
    RNA = pytest.importorskip("RNA")
    RNA.params_load_RNA_Turner2004()
    return RNA


def vienna_fc(RNA, seq, temperature, *, dangles=2):
    md = vienna_md(RNA)
    md.temperature, md.dangles = temperature, dangles
    return RNA.fold_compound(seq, md)


def random_sequence(rng, n, letters="ACGU"):
    return "".join(rng.choice(letters) for _ in range(n))


def test_kt_and_the_37_c_set_are_unchanged():
    assert layers.kt(37.0) == layers.KT
    assert layers.kt(50.0) == pytest.approx((50.0 + 273.15) * 1.98717 / 1000)
    base = layers.turner2004()
    assert "kT" not in base and "kT" not in layers.turner2004(temperature=37.0)
    same = layers.at_temperature(base, 37.0)
    assert all(np.array_equal(same[k], base[k]) for k in ep.TABLE_SHAPES)


def test_rescaled_tables_follow_viennas_rule():
    """G(T) = H - (H - G37) T/T37, truncated toward zero in dcal/mol; lxc scales with T; max_ninio stays."""
    t = 60.0
    factor = (t + 273.15) / 310.15
    g = ep._turner2004_raw()
    h = ep._turner2004_raw(enthalpies=True)
    hot = layers.turner2004(temperature=t)
    cg = 1  # ViennaRNA's pair type CG
    want = math.trunc(h["stack"][cg, cg] - (h["stack"][cg, cg] - g["stack"][cg, cg]) * factor) / 100
    assert float(hot["stack"][0, 0]) == pytest.approx(want, abs=1e-6)
    assert float(hot["lxc"]) == pytest.approx(1.07856 * factor, rel=1e-6)
    assert float(hot["max_ninio"]) == pytest.approx(3.0)
    assert float(hot["kT"]) == pytest.approx(layers.kt(t))
    exact = layers.turner2004(temperature=t, truncate=False)
    assert float(exact["stack"][0, 0]) == pytest.approx(
        (h["stack"][cg, cg] - (h["stack"][cg, cg] - g["stack"][cg, cg]) * factor) / 100, rel=1e-6)
    for key in ep.CLIPPED_TABLES:  # clipped at 0 after rescaling, as ViennaRNA does
        assert float(jnp.max(layers.turner2004(temperature=95.0)[key])) <= 0.0
    assert np.isinf(hot["hairpin"][:3]).all()  # INF stays INF


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_free_energy_equals_vienna_eval_at_temperature(RNA, temperature):
    """Structures from ViennaRNA's ensemble at that temperature, N letters, and a hairpin > 30 nt
    (lxc's extrapolation) and a long interior loop: free_energy equals eval_structure."""
    params = layers.turner2004(temperature=temperature)
    rng = random.Random(int(temperature * 10))
    cases = [("GGGGC" + "A" * 40 + "GCCCC", "(((((" + "." * 40 + ")))))"),
             ("GGGG" + "A" * 20 + "GAAAC" + "A" * 12 + "CCCC", "((((" + "." * 20 + "(...)" + "." * 12 + "))))")]
    for k in range(6):
        seq = random_sequence(rng, rng.randint(30, 90), "ACGU" if k % 3 else "ACGUN")
        fc = vienna_fc(RNA, seq, temperature)
        cases.append((seq, fc.mfe()[0]))
        fc.pf()
        cases += [(seq, s) for s in fc.pbacktrack(6)]
    assert_free_energies(RNA, params, cases, temperature)


def assert_free_energies(RNA, params, cases, temperature, *, dangles=2):
    """free_energy of (sequence, dot-bracket) ``cases``, in one batch, equals ViennaRNA's eval."""
    tokens, lengths = layers.encode_batch([seq for seq, _ in cases])
    got = np.asarray(layers.free_energy(params, tokens, [db for _, db in cases], lengths))
    for (seq, db), energy in zip(cases, got):
        want = vienna_fc(RNA, seq, temperature, dangles=dangles).eval_structure_pt(RNA.ptable(db)) / 100
        assert energy == pytest.approx(want, abs=1e-4), (temperature, seq, db)


@pytest.fixture(scope="module")
def hot_batch(RNA):
    rng = random.Random(7)
    seqs = [random_sequence(rng, n, "ACGU" if n % 2 else "ACGUN") for n in (48, 57, 60, 33)]
    return seqs, layers.encode_batch(seqs)


@pytest.mark.parametrize("temperature", (0.0, 60.0))
def test_partition_function_mfe_and_bpp_equal_vienna_float64(RNA, hot_batch, temperature):
    seqs, (tokens, lengths) = hot_batch
    with jax.enable_x64(True):
        params = layers.turner2004(jnp.float64, temperature=temperature)
        ensemble = np.asarray(layers.ensemble_free_energy(params, tokens, lengths))
        mfe = -float(params["kT"]) * np.asarray(layers.max_score(params, tokens, lengths))
        best = np.asarray(layers.best_structure(params, tokens, lengths))
        probs = np.asarray(layers.pair_probs(params, tokens, lengths))
    for b, seq in enumerate(seqs):
        n = len(seq)
        fc = vienna_fc(RNA, seq, temperature)
        structure, energy = fc.mfe()
        fc.exp_params_rescale(energy)
        _, g = fc.pf()
        assert ensemble[b] == pytest.approx(g, rel=1e-6, abs=1e-5)
        assert mfe[b] == pytest.approx(energy, abs=1e-4)
        assert fc.eval_structure(layers.to_dot_bracket(best[b, :n])) == pytest.approx(energy, abs=1e-4)
        np.testing.assert_allclose(np.triu(probs[b, :n, :n], 1), np.array(fc.bpp())[1:, 1:][:n, :n], atol=1e-6)


def test_partition_function_and_bpp_equal_vienna_float32(RNA, hot_batch):
    seqs, (tokens, lengths) = hot_batch
    params = layers.turner2004(temperature=45.0)
    ensemble = np.asarray(layers.ensemble_free_energy(params, tokens, lengths))
    probs = np.asarray(layers.pair_probs(params, tokens, lengths))
    assert np.isfinite(ensemble).all() and np.isfinite(probs).all()
    for b, seq in enumerate(seqs):
        n = len(seq)
        fc = vienna_fc(RNA, seq, 45.0)
        _, energy = fc.mfe()
        fc.exp_params_rescale(energy)
        _, g = fc.pf()
        assert ensemble[b] == pytest.approx(g, rel=1e-4)
        np.testing.assert_allclose(np.triu(probs[b, :n, :n], 1), np.array(fc.bpp())[1:, 1:][:n, :n], atol=1e-3)


def test_log_partition_equals_brute_force_at_temperature(RNA):
    """For short sequences: -kT log Z over every structure, with E from the float64 reference
    evaluator at that temperature and from ViennaRNA's eval, equals ensemble_free_energy."""
    rng = random.Random(3)
    with jax.enable_x64(True):
        params = layers.turner2004(jnp.float64, temperature=70.0)
        for n in (9, 14):
            seq = random_sequence(rng, n)
            got = float(layers.ensemble_free_energy(params, layers.encode(seq)))
            assert got == pytest.approx(brute_force_ensemble_free_energy(params, seq), abs=1e-8)
            fc = vienna_fc(RNA, seq, 70.0)
            fc.mfe()
            _, g = fc.pf()
            assert got == pytest.approx(g, abs=1e-5)


def test_phi_at_temperature_is_a_soft_constraint_in_that_temperatures_kt(RNA):
    seq = "GGGAAACCCAGCUUCGGCUGGGAAAUCCC"
    n, (i, j), e = len(seq), (0, 8), -1.5
    with jax.enable_x64(True):
        params = layers.turner2004(jnp.float64, temperature=55.0)
        phi = np.zeros((n, n))
        phi[i, j] = -e / layers.kt(55.0)
        got = float(layers.ensemble_free_energy(params, layers.encode(seq), phi=jnp.asarray(phi)))
    fc = vienna_fc(RNA, seq, 55.0)
    fc.sc_add_bp(i + 1, j + 1, e)
    fc.mfe()
    _, g = fc.pf()
    assert got == pytest.approx(g, abs=1e-5)


def test_par_files_rescale_with_their_own_enthalpies(RNA, tmp_path):
    """Turner 1999's .par (its own enthalpies) at 50 C equals ViennaRNA with that set at 50 C; a file
    without enthalpy sections takes Turner 2004's."""
    path = resources.files("foldax.layers").joinpath("data", "rna_turner1999.par")
    params = layers.load_params(str(path), temperature=50.0)
    assert float(params["kT"]) == pytest.approx(layers.kt(50.0))
    rng = random.Random(11)
    RNA.params_load_RNA_Turner1999()
    try:
        cases = []
        for _ in range(3):
            seq = random_sequence(rng, 50)
            fc = vienna_fc(RNA, seq, 50.0)
            fc.mfe()
            fc.pf()
            cases += [(seq, db) for db in fc.pbacktrack(5)]
        assert_free_energies(RNA, params, cases, 50.0)
    finally:
        RNA.params_load_RNA_Turner2004()
    tiny = tmp_path / "stack_only.par"
    tiny.write_text("## RNAfold parameter file v2.0\n# NINIO\n 50 0 250\n")
    moved = layers.load_parameter_file(tiny, temperature=50.0)
    reference = layers.turner2004(temperature=50.0)
    assert np.array_equal(moved["stack"], reference["stack"])  # Turner 2004's energies and enthalpies
    assert float(moved["ninio"]) == pytest.approx(math.trunc(0 - (0 - 50) * (323.15 / 310.15)) / 100)


def test_load_params_moves_energy_sets_and_refuses_scores(tmp_path):
    hot = layers.load_params("turner2004", temperature=50.0)
    assert np.array_equal(hot["int22"], layers.turner2004(temperature=50.0)["int22"])
    path = tmp_path / "t.npz"
    layers.save_params(layers.turner2004(), path)  # a set at 37 C without enthalpies: Turner 2004's apply
    assert np.array_equal(layers.load_params(path, temperature=50.0)["stack"], hot["stack"])
    for name in ("stacking", "handset"):
        with pytest.raises(ValueError, match="stacking-grammar scores have no temperature"):
            layers.load_params(name, temperature=50.0)
    with pytest.raises(ValueError, match="moves parameters at 37 C"):
        layers.at_temperature(hot, 60.0)
    with pytest.raises(ValueError, match="cannot save energies at kT"):
        layers.save_parameter_file(hot, tmp_path / "hot.par")
    with pytest.raises(ValueError, match="temperature must be"):
        layers.turner2004(temperature=-300.0)


def test_gradients_at_temperature_are_finite_and_kt_is_not_learned():
    params = layers.turner2004(temperature=65.0)
    tokens, lengths = layers.encode_batch(["GGGGAAACCCCAUAUGCGCAAAGCGC", "ACGUNACGUAGCUAGCUUCGAUCG"])
    grads = jax.grad(lambda p: jnp.sum(layers.log_partition(p, tokens, lengths)))(params)
    for key, g in grads.items():
        if key != "special_hairpins":
            assert np.isfinite(np.asarray(g)).all(), key
    assert float(grads["kT"]) == 0.0


@pytest.mark.parametrize("temperature", (37.0, 45.0))
def test_without_dangles_equals_vienna_dangles_0(RNA, hot_batch, temperature):
    """``layers.without_dangles`` (RNAfold -d0), alone and at another temperature: eval, MFE, log Z
    and pair probabilities equal ViennaRNA's with ``md.dangles = 0``."""
    seqs, (tokens, lengths) = hot_batch
    with jax.enable_x64(True):
        params = layers.without_dangles(layers.turner2004(jnp.float64, temperature=temperature))
        ensemble = np.asarray(layers.ensemble_free_energy(params, tokens, lengths))
        kt = float(params.get("kT", layers.KT))
        mfe = -kt * np.asarray(layers.max_score(params, tokens, lengths))
        probs = np.asarray(layers.pair_probs(params, tokens, lengths))
    cases = []
    for b, seq in enumerate(seqs):
        n = len(seq)
        fc = vienna_fc(RNA, seq, temperature, dangles=0)
        structure, energy = fc.mfe()
        fc.exp_params_rescale(energy)
        _, g = fc.pf()
        assert ensemble[b] == pytest.approx(g, rel=1e-6, abs=1e-5)
        assert mfe[b] == pytest.approx(energy, abs=1e-4)
        np.testing.assert_allclose(np.triu(probs[b, :n, :n], 1), np.array(fc.bpp())[1:, 1:][:n, :n], atol=1e-6)
        cases += [(seq, db) for db in [structure, *fc.pbacktrack(4)]]
    with jax.enable_x64(True):
        assert_free_energies(RNA, params, cases, temperature, dangles=0)
