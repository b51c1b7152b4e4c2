"""Mixtures of parameter sets: ``layers.mixture_pair_probs`` and ``foldax fold --params A+B --mea``.

The library function is checked on the stacking grammar (cheap to compile) against the weighted
mean of :func:`foldax.layers.pair_probs`; the command line on Turner 2004 + Turner 1999 against
ViennaRNA's pair probabilities of both sets (``fc.bpp()``) and its MEA decoder of their mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax import layers
from foldax.cli import main

SEQUENCES = ["GGGGAAACCCCAUAUGCGCAUAU", "GCGCUUCGGCGCAUAGCAUCUAUGC", "ACGUACGUAGGCUAGCUAGCAUCGAUCG"]


@pytest.fixture(scope="module")
def two_stacking_sets():
    return layers.default_params(), layers.init_params(jax.random.key(3), scale=1.0)


def test_mixture_is_the_weighted_mean_of_the_sets_pair_probs(two_stacking_sets):
    first, second = two_stacking_sets
    tokens, lengths = layers.encode_batch(SEQUENCES)
    p1 = np.asarray(layers.pair_probs(first, tokens, lengths))
    p2 = np.asarray(layers.pair_probs(second, tokens, lengths))
    assert np.abs(p1 - p2).max() > 0.1  # two different ensembles: the mixture is not trivially either
    mixed = np.asarray(layers.mixture_pair_probs([first, second], tokens, lengths, weights=[1.0, 3.0]))
    np.testing.assert_allclose(mixed, 0.25 * p1 + 0.75 * p2, atol=1e-6)
    uniform = np.asarray(layers.mixture_pair_probs([first, second], tokens, lengths))
    np.testing.assert_allclose(uniform, 0.5 * (p1 + p2), atol=1e-6)
    assert uniform.sum(axis=2).max() <= 1 + 1e-5 and np.allclose(uniform, np.swapaxes(uniform, 1, 2))
    single = layers.mixture_pair_probs([first, second], layers.encode(SEQUENCES[0]), weights=[1.0, 0.0])
    np.testing.assert_allclose(np.asarray(single), p1[0, : len(SEQUENCES[0]), : len(SEQUENCES[0])], atol=1e-6)


def test_mixture_gradients_are_finite_and_match_the_parts(two_stacking_sets):
    first, second = two_stacking_sets
    x = layers.encode(SEQUENCES[1])

    def top_pair(weights, params):
        return layers.mixture_pair_probs([params, second], x, weights=weights)[0, 24]

    w = jnp.array([0.3, 0.7])
    g_w, g_params = jax.grad(top_pair, argnums=(0, 1))(w, first)
    p1 = float(layers.pair_probs(first, x)[0, 24])
    p2 = float(layers.pair_probs(second, x)[0, 24])
    # d/dw_k of SUM_k w_k P_k / SUM w: (P_k - mixture) / SUM w
    mixture = 0.3 * p1 + 0.7 * p2
    np.testing.assert_allclose(np.asarray(g_w), [p1 - mixture, p2 - mixture], atol=1e-5)
    g_first = jax.grad(lambda p: layers.pair_probs(p, x)[0, 24])(first)
    for got, part in zip(jax.tree.leaves(g_params), jax.tree.leaves(g_first)):
        assert np.all(np.isfinite(np.asarray(got)))
        np.testing.assert_allclose(np.asarray(got), 0.3 * np.asarray(part), atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights=[1.0]), "2 parameter sets but weights of shape"),
    (dict(weights=[1.0, -1.0]), "nonnegative"),
    (dict(weights=[0.0, 0.0]), "not all 0"),
    (dict(weights=[1.0, float("nan")]), "finite"),
])
def test_bad_mixture_weights_are_clear_errors(two_stacking_sets, kwargs, message):
    with pytest.raises(ValueError, match=message):
        layers.mixture_pair_probs(list(two_stacking_sets), layers.encode(SEQUENCES[0]), **kwargs)
    with pytest.raises(ValueError, match="at least one parameter set"):
        layers.mixture_pair_probs([], layers.encode(SEQUENCES[0]))


def _run(capsys, argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _mea_objective(table, probs, gamma):
    """ViennaRNA's MEA objective of a pair table under symmetric probabilities ``probs``."""
    unpaired = 1 - probs.sum(axis=1)
    return sum(2 * gamma * probs[i, j] if j > i else (unpaired[i] if j < 0 else 0.0) for i, j in enumerate(table))


def test_fold_a_mixture_of_turner_sets_as_vienna(capsys, tmp_path):
    """``--params turner2004+turner1999 --mea -p``: the bpp file is the mean of ViennaRNA's two
    ``fc.bpp()``; the MEA structure (gamma 0.5, turner2004's) is optimal for that mean, as ViennaRNA's
    ``MEA_from_plist``'s; energies and the ensemble free energy are Turner 2004's."""
    RNA = pytest.importorskip("RNA")
    sequence = "GGGAAAUCCGCGCAUAGCGCGAAAGCUUCGGCAAUCCGUACGAUGCAGGCAUCCG"
    n = len(sequence)
    bpps, ensemble = [], {}
    try:
        for name in ("Turner2004", "Turner1999"):
            getattr(RNA, f"params_load_RNA_{name}")()
            md = RNA.md()
            md.pf_smooth = 0
            fc = RNA.fold_compound(sequence, md)
            fc.pf()
            ensemble[name] = fc.pf()[1]
            upper = np.triu(np.array(fc.bpp())[1:, 1:], 1)
            bpps.append(upper + upper.T)
        RNA.params_load_RNA_Turner2004()
        mix = 0.5 * (bpps[0] + bpps[1])
        assert np.abs(bpps[0] - bpps[1]).max() > 0.05  # the sets disagree on this sequence
        plist = [RNA.ep(i + 1, j + 1, float(mix[i, j]), RNA.PLIST_TYPE_BASEPAIR)
                 for i in range(n) for j in range(i + 1, n) if mix[i, j] >= 1e-6]
        theirs = layers.from_dot_bracket(RNA.MEA_from_plist(plist, sequence, 0.5)[0])
    finally:
        RNA.params_load_RNA_Turner2004()

    rc, out, err = _run(capsys, ["fold", sequence, "--params", "turner2004+turner1999", "--mea", "-p",
                                 "-o", f"{tmp_path}/"])
    assert rc == 0, err
    assert "parameters: turner2004+turner1999: " in err and "turner1999: Turner 1999" in err
    lines = out.splitlines()
    structure, energy = lines[2].split(" ", 1)[0], float(lines[2].rsplit("(", 1)[1].rstrip(")"))
    ours = layers.from_dot_bracket(structure)
    fc = RNA.fold_compound(sequence)
    assert energy == pytest.approx(fc.eval_structure(structure), abs=1e-3)
    assert _mea_objective(ours, mix, 0.5) >= _mea_objective(theirs, mix, 0.5) - 1e-4
    assert abs(ensemble["Turner2004"] - ensemble["Turner1999"]) > 0.1
    assert float(lines[3].rsplit("[", 1)[1].rstrip("]")) == pytest.approx(ensemble["Turner2004"], abs=0.006)
    got = np.zeros((n, n))
    for line in (tmp_path / "seq1_bpp.txt").read_text().splitlines():
        if line and not line.startswith("#") and line.split()[0].isdigit():
            i, j, p = line.split()
            got[int(i) - 1, int(j) - 1] = got[int(j) - 1, int(i) - 1] = float(p)
    assert np.abs(got - mix).max() <= 2e-4  # (pairs below the file's 1e-5 cutoff read as 0)


def test_a_mixture_folds_by_mea_and_bad_specs_are_clear_errors(capsys, monkeypatch):
    """A mixture (the default too) folds by MEA with or without ``--mea``; ``A+B`` of other sets is a
    uniform mixture at A's gamma."""
    from foldax import cli, programs
    from foldax.fold import load_model

    shared = programs.FoldPrograms(None)  # one compiled program per mixture
    monkeypatch.setattr(cli, "_program_cache", lambda own_process: shared)
    sequence = "GCAUUAACAUGGCGUAUACUUAUUCCUUGCAUCGGACGAG"
    for spec in ("turner2004+turner1999", "turner2004+turner1999+stacking"):
        with_mea = _run(capsys, ["fold", sequence, "--params", spec, "--mea"])
        assert with_mea[0] == 0, with_mea[2]
        assert _run(capsys, ["fold", sequence, "--params", spec])[1] == with_mea[1]
    assert _run(capsys, ["fold", sequence])[1] == with_mea[1]  # the default
    assert shared.stats["compiled"] == 2
    model = load_model("turner2004+andronescu2007")
    assert model.mixture == (0.5, 0.5) and model.mea_gamma == 0.5  # turner2004's
    assert model.notes[0].startswith("parameters: turner2004+andronescu2007: a mixture of turner2004, andronescu2007")
    assert "(weights: turner2004 0.5, andronescu2007 0.5)" in model.notes[0]
    assert _run(capsys, ["fold", sequence, "--params", "turner2004", "--gamma", "2"])[0] == 2  # needs --mea
    rc, _, err = _run(capsys, ["fold", "GGGGAAACCCC", "--params", "turner2004+stacking", "--noLP"])
    assert rc == 2 and "--noLP needs energy parameters" in err and "turner2004+stacking" in err
    rc, _, err = _run(capsys, ["fold", "GGGGAAACCCC", "--params", "turner2004+", "--mea"])
    assert rc == 1 and "two or more parameter sets joined by '+'" in err
    rc, _, err = _run(capsys, ["fold", "GGGGAAACCCC", "--params", "turner2004+nosuchset", "--mea"])
    assert rc == 1 and "nosuchset" in err


def test_the_shipped_mixture_with_a_stacking_member_folds_its_weighted_pair_probs():
    """Members of both grammars mix (their pair probabilities are comparable): ``foldax fold`` of the
    shipped ``turner2004+turner1999+stacking`` decodes the registry's weighting of the members'
    pair probabilities at its gamma, and prints Turner 2004's free energy of that structure."""
    from foldax.fold import InputRecord, fold_records, load_model

    model = load_model("turner2004+turner1999+stacking")
    assert model.mixture == pytest.approx((0.35, 0.35, 0.3)) and model.mea_gamma == 1.0
    assert model.energy_kT == pytest.approx(layers.KT)  # Turner 2004's energies are printed
    mix = layers.load_mixture("turner2004+turner1999+stacking")
    assert [layers.is_energy_params(p) for p in mix.members] == [True, True, False]
    sequence = "GGGAAAUCCCGCGCAUAUGCGCAAAGGGUUCGACCUGAGCUAGC"
    [got] = fold_records(model, [InputRecord("x", sequence)], probs=True)
    x = layers.encode(sequence)
    probs = np.asarray(layers.mixture_pair_probs(mix.members, x, weights=mix.weights))
    stacking_only = np.asarray(layers.pair_probs(mix.members[2], x))
    assert np.abs(probs - stacking_only).max() > 0.05  # (so the check below sees every member)
    assert np.abs(got.probs - probs).max() <= 1e-4
    expected = np.asarray(layers.mea_structure(jnp.asarray(probs), gamma=mix.mea_gamma))
    assert _mea_objective(got.structure, probs, 1.0) >= _mea_objective(expected, probs, 1.0) - 1e-4
    assert got.energy == pytest.approx(float(layers.free_energy(mix.members[0], x, got.structure)), abs=1e-3)
