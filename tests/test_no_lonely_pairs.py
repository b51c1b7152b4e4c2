"""``no_lonely_pairs=True`` (RNAfold's ``--noLP``) for the Turner grammar, against brute force and
ViennaRNA.

The ensemble is every structure of the Turner folding space in which each pair stacks on a
neighbouring pair (``layers.dotbracket.lonely_pairs`` is empty). Oracles: brute force over that
set with ViennaRNA's ``eval_structure`` energies (log Z, pair probabilities, the best structure,
samples), and ViennaRNA's ``fc.mfe()`` with ``md.noLP = 1``. ViennaRNA's ``md.noLP = 1`` partition
function is *not* that sum: it only removes the pairs that cannot stack at all (RNAfold's man
page says so), which a test below checks, so the ensemble free energies differ on purpose.
"""

from __future__ import annotations

import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from test_cli import assert_rnafold_lines, vienna_fold
from test_turner import padded, random_sequence, sample_fit, vienna_structure_weights
from vienna_helpers import CANONICAL, vienna_log_q, vienna_md, vienna_rna_sequence

from foldax import layers
from foldax.cli import main
from foldax.layers.dotbracket import StructureError, lonely_pairs, table_from_pairs

jax.config.update("jax_enable_x64", True)

KT = layers.KT
BATCH, WIDTH = 8, 16


@pytest.fixture(scope="module")
def RNA():
    module = pytest.importorskip("RNA")
    module.params_load_RNA_Turner2004()
    return module


@pytest.fixture(scope="module")
def turner64():
    return layers.turner2004(jnp.float64)


def without_lonely_pairs(structures, weights, n):
    keep = [k for k, s in enumerate(structures) if not lonely_pairs(table_from_pairs(s, n))]
    return [structures[k] for k in keep], weights[keep]


@pytest.fixture(scope="module")
def batch(RNA):
    """GC-rich random sequences of 6..16 nt (helices, so that both kinds of pair occur), random phi,
    and every structure without lonely pairs with its log-weight."""
    rng = random.Random(31)
    seqs = [random_sequence(rng, n, "GGCCAU" if n % 2 else "ACGU") for n in (6, 9, 11, 12, 13, 14, 15, 16)]
    tokens, lengths = padded(seqs, WIDTH, seed=32)
    phi = np.random.default_rng(33).normal(0.0, 1.0, size=(BATCH, WIDTH, WIDTH))
    ensembles = []
    for b, seq in enumerate(seqs):
        structures, weights = vienna_structure_weights(RNA, seq, phi=phi[b])
        ensembles.append(without_lonely_pairs(structures, weights, len(seq)))
    # Some structure of the sweep has a lonely pair and is left out: the option is not a no-op.
    assert sum(len(vienna_structure_weights(RNA, s)[0]) for s in seqs) > sum(len(e[0]) for e in ensembles)
    return seqs, tokens, lengths, phi, ensembles


def test_log_partition_and_pair_probs_equal_brute_force(batch, turner64):
    seqs, tokens, lengths, phi, ensembles = batch
    log_z = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=phi, no_lonely_pairs=True))
    probs = np.asarray(layers.pair_probs(turner64, tokens, lengths, phi=phi, no_lonely_pairs=True))
    probs32 = np.asarray(layers.pair_probs(layers.turner2004(jnp.float32), tokens, lengths, phi=phi.astype(np.float32),
                                           no_lonely_pairs=True))
    assert probs.dtype == np.float64 and probs32.dtype == np.float32
    for b, seq in enumerate(seqs):
        n = len(seq)
        structures, weights = ensembles[b]
        assert log_z[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), seq
        expected = np.zeros((n, n))
        for s, p in zip(structures, np.exp(weights - logsumexp(weights))):
            for i, j in s:
                expected[i, j] += p
                expected[j, i] += p
        np.testing.assert_allclose(probs[b, :n, :n], expected, rtol=0, atol=1e-10, err_msg=seq)
        np.testing.assert_allclose(probs32[b, :n, :n], expected, rtol=0, atol=1e-4, err_msg=seq)
        assert not probs[b, n:].any() and not probs[b, :, n:].any()


def test_best_structure_is_viennas_no_lp_mfe(RNA, batch, turner64):
    seqs, tokens, lengths, _, ensembles = batch
    best_score = np.asarray(layers.max_score(turner64, tokens, lengths, no_lonely_pairs=True))
    best = np.asarray(layers.best_structure(turner64, tokens, lengths, no_lonely_pairs=True))
    energy = np.asarray(layers.free_energy(turner64, tokens, best, lengths))
    for b, seq in enumerate(seqs):
        n = len(seq)
        md = vienna_md(RNA)
        md.noLP = 1
        _, mfe = RNA.fold_compound(vienna_rna_sequence(seq), md).mfe()
        assert -KT * best_score[b] == pytest.approx(mfe, abs=1e-4), seq
        assert energy[b] == pytest.approx(mfe, abs=1e-4), seq
        assert lonely_pairs(best[b, :n]) == [], seq
        structures, _ = ensembles[b]
        assert tuple(sorted((i, int(j)) for i, j in enumerate(best[b, :n]) if j > i)) in set(structures)


def test_log_prob_and_structures_with_lonely_pairs(batch, turner64):
    seqs, tokens, lengths, phi, ensembles = batch
    b = 7
    n = len(seqs[b])
    structures, weights = ensembles[b]
    top = int(np.argmax(weights))
    pt = np.full((BATCH, WIDTH), -1, np.int32)
    pt[b, :n] = table_from_pairs(structures[top], n)
    got = np.asarray(layers.log_prob(turner64, tokens, pt, lengths, phi=phi, no_lonely_pairs=True))
    assert got[b] == pytest.approx(weights[top] - logsumexp(weights), abs=1e-9)

    # A lonely pair: outside the ensemble. A clear error outside jit, -inf under it.
    pair = next((i, j) for i in range(n) for j in range(i + 4, n)
                if vienna_rna_sequence(seqs[b])[i] + vienna_rna_sequence(seqs[b])[j] in CANONICAL)
    single = np.full((BATCH, WIDTH), -1, np.int32)
    single[b, :n] = table_from_pairs([pair], n)
    with pytest.raises(StructureError, match=rf"sequence {b} .*pair \({pair[0]}, {pair[1]}\) is a lonely pair"):
        layers.log_prob(turner64, tokens, single, lengths, phi=phi, no_lonely_pairs=True)
    jitted = jax.jit(lambda t: layers.log_prob(turner64, tokens, t, lengths, phi=phi, no_lonely_pairs=True))
    out = np.asarray(jitted(single))
    assert out[b] == -np.inf and np.isfinite(np.delete(out, b)).all()
    # Without the option the same structure has a finite log-probability.
    assert np.isfinite(float(layers.log_prob(turner64, tokens, single, lengths, phi=phi)[b]))


def test_gradients_are_finite_and_expected_counts(batch, turner64):
    """d log Z / d phi is the pair probabilities, and every table's gradient is finite (float32)."""
    seqs, tokens, lengths, phi, _ = batch
    grad_phi = jax.grad(lambda f: jnp.sum(layers.log_partition(turner64, tokens, lengths, phi=f,
                                                                no_lonely_pairs=True)))(phi)
    probs = np.asarray(layers.pair_probs(turner64, tokens, lengths, phi=phi, no_lonely_pairs=True))
    np.testing.assert_allclose(np.triu(np.asarray(grad_phi), 1), np.triu(probs, 1), atol=1e-12)
    params32 = layers.turner2004(jnp.float32)
    grads = jax.grad(lambda p: jnp.sum(layers.log_partition(p, tokens, lengths, no_lonely_pairs=True)))(params32)
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(np.asarray(leaf)).all(), jax.tree_util.keystr(path)
    assert float(jnp.abs(grads["stack"]).sum()) > 0


def test_viennas_no_lp_partition_function_only_drops_pairs_that_cannot_stack(RNA, batch, turner64):
    """Why ensemble_free_energy(no_lonely_pairs=True) differs from ViennaRNA's md.noLP = 1 pf: its pf
    and pair probabilities equal ours without the option, with layers.isolated_pairs forbidden."""
    seqs, tokens, lengths, _, ensembles = batch
    isolated = np.asarray(layers.isolated_pairs(tokens, lengths))
    for b, seq in enumerate(seqs):  # the rule, written out
        s, n = vienna_rna_sequence(seq), len(seq)

        def can_pair(i, j):
            return 0 <= i and j < n and j - i > 3 and s[i] + s[j] in CANONICAL

        want = [[can_pair(i, j) and not (can_pair(i + 1, j - 1) or can_pair(i - 1, j + 1)) for j in range(WIDTH)]
                for i in range(WIDTH)]
        np.testing.assert_array_equal(isolated[b], np.array(want))
    forbid = np.where(isolated, layers.FORBIDDEN_PHI, 0.0)
    ours = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=forbid))
    ours_probs = np.asarray(layers.pair_probs(turner64, tokens, lengths, phi=forbid))
    exact = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=np.zeros_like(forbid),
                                            no_lonely_pairs=True))
    differ = 0
    for b, seq in enumerate(seqs):
        md = vienna_md(RNA)
        md.noLP = 1
        fc = RNA.fold_compound(vienna_rna_sequence(seq), md)
        fc.pf()
        assert ours[b] == pytest.approx(vienna_log_q(fc), rel=1e-9, abs=1e-9), seq
        n = len(seq)
        np.testing.assert_allclose(np.triu(ours_probs[b, :n, :n], 1), np.array(fc.bpp())[1:, 1:], atol=1e-9)
        assert exact[b] <= ours[b] + 1e-12
        differ += exact[b] < ours[b] - 1e-6
    assert differ >= 2


def test_stacking_parameters_and_bad_values_are_refused():
    x = layers.encode("GGGGAAACCCC")
    with pytest.raises(ValueError, match="no_lonely_pairs=True needs Turner energy parameters"):
        layers.log_partition(layers.default_params(), x, no_lonely_pairs=True)
    with pytest.raises(TypeError, match="no_lonely_pairs must be a bool"):
        layers.max_score(layers.turner2004(), x, no_lonely_pairs="yes")


def test_flax_layers_take_the_option(batch, turner64):
    """InsideLayer(no_lonely_pairs=True) (NNX and Linen) gives the restricted ensemble; its parameter
    gradients are the function's; a stacking layer refuses the option."""
    from flax import nnx

    from foldax.layers import InsideLayer, LinenInsideLayer

    seqs, tokens, lengths, phi, ensembles = batch
    layer = InsideLayer(params=turner64, no_lonely_pairs=True, param_dtype=jnp.float64)
    log_z = np.asarray(layer(tokens, lengths, phi=phi))
    for b, (_, weights) in enumerate(ensembles):
        assert log_z[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), seqs[b]
    best = np.asarray(layer.best_structure(tokens, lengths, phi=phi))
    assert all(lonely_pairs(best[b, : len(s)]) == [] for b, s in enumerate(seqs))
    grads = nnx.grad(lambda m: jnp.sum(m(tokens, lengths, phi=phi)))(layer)
    want = jax.grad(lambda p: jnp.sum(layers.log_partition(p, tokens, lengths, phi=phi, no_lonely_pairs=True)))(
        turner64)
    for name in ("stack", "hairpin", "ml_closing", "mismatch_exterior"):
        np.testing.assert_allclose(np.asarray(getattr(grads, name)[...]), np.asarray(want[name]),
                                   rtol=1e-9, atol=1e-12)
    linen = LinenInsideLayer(params=turner64, no_lonely_pairs=True, param_dtype=jnp.float64)
    variables = linen.init(jax.random.key(0), tokens, lengths, phi=phi)
    np.testing.assert_allclose(np.asarray(linen.apply(variables, tokens, lengths, phi=phi)), log_z, rtol=1e-12)
    with pytest.raises(ValueError, match="no_lonely_pairs=True needs Turner energy parameters"):
        InsideLayer(params="default", no_lonely_pairs=True)


def test_lonely_pairs_helper():
    assert lonely_pairs(layers.from_dot_bracket("((...))..(...)")) == [(9, 13)]
    assert lonely_pairs(layers.from_dot_bracket("(.(...).)")) == [(0, 8), (2, 6)]  # a bulge does not stack
    assert lonely_pairs(layers.from_dot_bracket("((((...))))")) == []
    assert lonely_pairs(layers.from_dot_bracket("(...)")) == [(0, 4)]
    assert lonely_pairs(np.full(5, -1)) == []


def test_fold_command_no_lp(RNA, capsys):
    seq = "AGUCCGAGGAGAGGGUGCUUCAGAGUAUGUAUACCACUGG"
    md = vienna_md(RNA)
    md.noLP = 1
    structure, mfe = RNA.fold_compound(seq, md).mfe()
    plain, _ = RNA.fold_compound(seq, vienna_md(RNA)).mfe()
    assert structure != plain  # the option changes this sequence's MFE structure
    assert main(["fold", "--noLP", "--params", "turner2004", seq]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == f"{structure} ({mfe:6.2f})"
    # -p: RNAfold -p --noLP's lines and numbers (its ensemble), or with --noLP-exact the exact ensemble
    want = vienna_fold(RNA, seq, no_lp=True)
    assert main(["fold", "-p", "--noLP", "--params", "turner2004", seq]) == 0
    assert_rnafold_lines(capsys.readouterr().out.splitlines()[2:], want)
    assert main(["fold", "-p", "--noLP-exact", "--params", "turner2004", seq]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == f"{structure} ({mfe:6.2f})"
    exact = float(layers.ensemble_free_energy(layers.turner2004(), layers.encode(seq), no_lonely_pairs=True))
    g = float(re.fullmatch(r"\S+ \[\s*(-?\d+\.\d\d)\]", out[3]).group(1))
    assert abs(g - exact) <= 0.005 + 1e-4 and g > want["ensemble"] + 0.01
    for flag in ("--noLP", "--noLP-exact"):
        assert main(["fold", flag, "--params", "handset", seq]) == 2
        assert "--noLP needs energy parameters" in capsys.readouterr().err
    # Without --params: the default's stacking member has no --noLP, so its energy members fold, and
    # stderr says so
    assert main(["fold", "--noLP", "--params", "turner2004+turner1999", seq]) == 0
    energy_only = capsys.readouterr().out
    assert main(["fold", "--noLP", seq]) == 0
    out, err = capsys.readouterr()
    assert out == energy_only and "folding with turner2004+turner1999, the default without its stacking" in err
    assert "parameters: turner2004+turner1999: " in err


@pytest.mark.slow
def test_long_sequences_and_samples(RNA):
    """float32 MFE of random 60..128-nt sequences equals ViennaRNA's noLP MFE; 4,000 samples of two
    20-nt sequences (Turner 2004 x 0.3: a flatter ensemble) follow the exact distribution over the
    structures without lonely pairs."""
    rng = random.Random(34)
    seqs = [random_sequence(rng, n) for n in (60, 90, 110, 128)]
    params = layers.turner2004(jnp.float32)
    tokens, lengths = padded(seqs, 128, seed=35)
    best = np.asarray(layers.best_structure(params, tokens, lengths, no_lonely_pairs=True))
    energy = np.asarray(layers.free_energy(params, tokens, best, lengths))
    changed = 0
    for b, seq in enumerate(seqs):
        md = vienna_md(RNA)
        md.noLP = 1
        _, mfe = RNA.fold_compound(seq, md).mfe()
        assert energy[b] == pytest.approx(mfe, abs=1e-4), seq
        assert lonely_pairs(best[b, : len(seq)]) == []
        changed += mfe > RNA.fold_compound(seq, vienna_md(RNA)).mfe()[1] + 1e-3
    assert changed >= 1  # the 110-nt sequence's MFE has a lonely pair

    short = [random_sequence(rng, 20, "GCAU") for _ in range(2)]  # 77 and 59 structures
    tokens, lengths = padded(short, 20, seed=36)
    scaled = jax.tree.map(lambda v: 0.3 * v, params)  # a flatter ensemble: more bins
    samples = np.asarray(layers.sample_structures(jax.random.key(0), scaled, tokens, 4000, lengths,
                                                  no_lonely_pairs=True))
    for b, seq in enumerate(short):
        n = len(seq)
        structures, weights = without_lonely_pairs(*vienna_structure_weights(RNA, seq), n)
        p_value, bins = sample_fit(samples[b], n, structures, 0.3 * weights)  # fails on a lonely pair
        assert bins >= 40 and p_value > 1e-3, (seq, p_value, bins)


@pytest.mark.slow
def test_realistic_lengths_as_foldax_fold_runs_them(RNA):
    """180 and 300 nt (two length buckets), float32, through foldax fold's jitted programs: the MFE
    is ViennaRNA's noLP MFE, RNAfold's -p --noLP ensemble free energy and pair probabilities are
    ViennaRNA's; the exact ensemble's log Z agrees between float32 and float64 and lies below
    RNAfold's."""
    from foldax import fold as F

    rng = random.Random(37)
    seqs = [random_sequence(rng, n) for n in (180, 300)]
    records = [F.InputRecord(f"r{k}", s) for k, s in enumerate(seqs)]
    results = F.fold_records(layers.turner2004(), records, partition=True, probs=True, no_lonely_pairs=True)
    tokens, lengths = layers.encode_batch(seqs, buckets=None)  # one program per dtype for both lengths
    exact = {dtype: np.asarray(layers.log_partition(layers.turner2004(dtype), tokens, lengths, no_lonely_pairs=True))
             for dtype in (jnp.float64, jnp.float32)}
    for b, (seq, result) in enumerate(zip(seqs, results, strict=True)):
        md = vienna_md(RNA)
        md.noLP = 1
        fc = RNA.fold_compound(seq, md)
        _, mfe = fc.mfe()
        fc.exp_params_rescale(mfe)
        fc.pf()
        assert result.energy == pytest.approx(mfe, abs=1e-4) and lonely_pairs(result.structure) == []
        assert result.log_z == pytest.approx(vienna_log_q(fc), rel=1e-4)
        np.testing.assert_allclose(np.triu(result.probs, 1), np.array(fc.bpp())[1:, 1:], atol=1e-3)
        exact64, exact32 = float(exact[jnp.float64][b]), float(exact[jnp.float32][b])
        assert exact32 == pytest.approx(exact64, rel=1e-5) and exact64 < vienna_log_q(fc) - 0.1
