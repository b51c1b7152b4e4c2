"""Hard constraints in RNAfold's notation (``layers.constraint_phi``, ``foldax fold -C``).

Oracles: the constraint's definition applied to whole structures (brute force over every structure
of a short sequence), ViennaRNA's hard constraints (``fc.hc_add_from_db(c, CONSTRAINT_DB_DEFAULT)``:
its pf, MFE and pair probabilities) and the stacking grammar's float64 enumerator.
"""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from test_cli import assert_rnafold_lines, run, vienna_fold
from test_turner import padded, random_sequence
from vienna_helpers import vienna_bpp, vienna_md, vienna_pf_result

from foldax import layers
from foldax.layers.constraints import allowed_pairs
from foldax.layers.reference import enumerate_structures, random_params, structure_score_reference

jax.config.update("jax_enable_x64", True)

KT = layers.KT


@pytest.fixture(scope="module")
def RNA():
    module = pytest.importorskip("RNA")
    module.params_load_RNA_Turner2004()
    return module


def satisfies(pairs, constraint: str) -> bool:
    """RNAfold's definition, read position by position on a whole structure."""
    partner = {}
    for i, j in pairs:
        partner[i], partner[j] = j, i
    opened, matched = [], []
    for pos, symbol in enumerate(constraint):
        if symbol == "(":
            opened.append(pos)
        elif symbol == ")":
            matched.append((opened.pop(), pos))
    for pos, symbol in enumerate(constraint):
        p = partner.get(pos)
        if p is not None and (symbol == "x" or (symbol == "<" and p < pos) or (symbol == ">" and p > pos)):
            return False
    for a, b in matched:
        if partner.get(a, b) != b or partner.get(b, a) != a:
            return False
        if any(i < a < j < b or a < i < b < j for i, j in pairs):
            return False
    return True


def random_constraint(rng: random.Random, n: int, pairs=(), *, bracket_rate=0.5, rate=0.25) -> str:
    """Some of ``pairs`` as ``( )`` (or random nested brackets when none are given), and ``x < > |`` at
    a ``rate`` of the other positions."""
    symbols = ["."] * n
    chosen = [p for p in pairs if rng.random() < bracket_rate]
    if not pairs:
        for _ in range(2):
            a, b = sorted(rng.sample(range(n), 2))
            if all(not (i < a < j < b or a < i < b < j) and {a, b}.isdisjoint({i, j}) for i, j in chosen):
                chosen.append((a, b))
    for a, b in chosen:
        symbols[a], symbols[b] = "(", ")"
    for pos in range(n):
        if symbols[pos] == "." and rng.random() < rate:
            symbols[pos] = rng.choice("x<>|")
    return "".join(symbols)


def test_a_constraint_is_the_pairs_it_allows():
    """A structure satisfies the constraint exactly when every one of its pairs is allowed, so a
    ``phi`` on pairs holds the whole constraint."""
    rng = random.Random(5)
    structures = list(enumerate_structures(12, 3))
    for _ in range(30):
        constraint = random_constraint(rng, 12)
        allowed = allowed_pairs(constraint)
        assert np.array_equal(allowed, allowed.T)
        kept = [s for s in structures if satisfies(s, constraint)]
        assert kept == [s for s in structures if all(allowed[i, j] for i, j in s)]
        assert () in kept and len(kept) < len(structures) or set(constraint) <= set(".|")


def test_bad_constraints_name_what_and_where():
    with pytest.raises(ValueError, match=r"unknown symbol 'q' at position 3 \(1-based"):
        layers.constraint_phi("..q..")
    with pytest.raises(ValueError, match=r"'\)' at position 2 \(1-based\) closes no '\('"):
        layers.constraint_phi(".)..")
    with pytest.raises(ValueError, match=r"'\(' at position 2 \(1-based\) is never closed"):
        layers.constraint_phi(".((.)")
    with pytest.raises(ValueError, match="constraint has length 4 but the sequence has 5"):
        layers.constraint_phi("....", "GGACC")
    with pytest.raises(ValueError, match=r"positions 1 and 5 \(1-based\), G-A, which cannot pair"):
        layers.constraint_phi("(...)", "GGACA")
    with pytest.raises(ValueError, match=r"positions 1 and 5 \(1-based\), N-C"):
        layers.constraint_phi("(...)", "NGACC")
    phi = layers.constraint_phi("x(..)", "AGAAU", length=8)
    assert phi.shape == (8, 8) and not phi[5:].any() and not phi[:, 5:].any()
    assert phi[1, 4] == 0 and phi[0, 4] == layers.FORBIDDEN_PHI == phi[4, 0]


def enumerated_ensemble(params, tokens, kept, n):
    """(scores, log Z, pair probabilities) of the float64 enumeration over the structures ``kept``."""
    scores = np.array([structure_score_reference(params, tokens, s) for s in kept])
    want = logsumexp(scores)
    probs = np.zeros((n, n))
    for w, s in zip(np.exp(scores - want), kept):
        for i, j in s:
            probs[i, j] += w
            probs[j, i] += w
    return scores, want, probs


def test_stacking_grammar_matches_the_constrained_enumeration():
    """The stacking grammar's log Z and pair probabilities with a constraint's phi equal the float64
    enumeration over the structures that satisfy it (large random scores, float64 and float32)."""
    rng = random.Random(8)
    params = random_params(np.random.default_rng(8), scale=3.0)
    n = 11
    tokens = np.array([rng.randrange(4) for _ in range(n)], np.int32)
    structures = list(enumerate_structures(n, 3))
    for _ in range(3):
        constraint = random_constraint(rng, n)
        kept = [s for s in structures if satisfies(s, constraint)]
        scores, want, probs = enumerated_ensemble(params, tokens, kept, n)
        for dtype, tol in ((jnp.float64, 1e-9), (jnp.float32, 2e-4)):
            p = jax.tree.map(lambda a, dtype=dtype: jnp.asarray(a, dtype), params)
            phi = jnp.asarray(layers.constraint_phi(constraint), dtype)
            assert float(layers.log_partition(p, tokens, phi=phi)) == pytest.approx(want, rel=tol, abs=tol)
            np.testing.assert_allclose(np.asarray(layers.pair_probs(p, tokens, phi=phi)), probs, atol=10 * tol)
            best = np.asarray(layers.best_structure(p, tokens, phi=phi))
            assert satisfies([(i, int(j)) for i, j in enumerate(best) if j > i], constraint)


def vienna_constrained(RNA, seq: str, constraint: str):
    """(G of the pf, MFE structure, MFE, pair probabilities) under ViennaRNA's default hard constraints."""
    fc = RNA.fold_compound(seq, vienna_md(RNA))
    fc.hc_add_from_db(constraint, RNA.CONSTRAINT_DB_DEFAULT)
    structure, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    fc.pf()
    return vienna_pf_result(fc), structure, mfe, vienna_bpp(fc)


def constrained_batch(RNA, rng, lengths, width):
    """Random sequences, each with a constraint built on a structure from ViennaRNA's ensemble (so that
    its ``( )`` pairs can form), ViennaRNA's constrained results, tokens and phi."""
    seqs, constraints, want, free = [], [], [], []
    for n in lengths:
        seq = random_sequence(rng, n, "GGCCAU")
        fc = RNA.fold_compound(seq, vienna_md(RNA))
        structure, _ = fc.mfe()
        fc.pf()
        free.append(vienna_pf_result(fc))
        RNA.init_rand(rng.randrange(1 << 30))  # ViennaRNA's sampler draws from its own generator
        sample = fc.pbacktrack()
        # An empty sample would leave random_constraint to invent brackets that may not pair.
        table = layers.from_dot_bracket(sample if "(" in sample else structure)
        pairs = [(i, int(j)) for i, j in enumerate(table) if j > i]
        assert pairs, seq
        constraint = random_constraint(rng, n, pairs)
        seqs.append(seq)
        constraints.append(constraint)
        want.append(vienna_constrained(RNA, seq, constraint))
    assert all(w[0] > g + 0.01 for w, g in zip(want, free))  # every constraint changes the ensemble
    tokens, lengths = padded(seqs, width, seed=3)
    phi = np.stack([layers.constraint_phi(c, s, length=width) for c, s in zip(constraints, seqs)])
    return seqs, constraints, want, tokens, lengths, phi


def check_against_vienna(params, batch, *, pf_rtol, mfe_tol, bpp_tol):
    seqs, constraints, want, tokens, lengths, phi = batch
    phi = jnp.asarray(phi, jax.tree.leaves(params)[0].dtype)
    g = np.asarray(layers.ensemble_free_energy(params, tokens, lengths, phi=phi))
    best_score = np.asarray(layers.max_score(params, tokens, lengths, phi=phi))
    best = np.asarray(layers.best_structure(params, tokens, lengths, phi=phi))
    probs = np.asarray(layers.pair_probs(params, tokens, lengths, phi=phi))
    energies = np.asarray(layers.free_energy(params, tokens, best, lengths))
    for row, (seq, constraint, (pf, _, mfe, bpp)) in enumerate(zip(seqs, constraints, want)):
        n = len(seq)
        assert g[row] == pytest.approx(pf, rel=pf_rtol, abs=pf_rtol)
        assert -KT * best_score[row] == pytest.approx(mfe, abs=mfe_tol)
        pairs = [(i, int(j)) for i, j in enumerate(best[row][:n]) if j > i]
        assert satisfies(pairs, constraint)
        assert energies[row] == pytest.approx(mfe, abs=mfe_tol)  # ties may pick another structure
        np.testing.assert_allclose(probs[row, :n, :n], bpp, atol=bpp_tol)


def test_turner_grammar_matches_vienna_hard_constraints(RNA):
    """float64: ensemble free energy, MFE and pair probabilities equal ViennaRNA's under the same
    constraints, and the best structure satisfies its constraint."""
    batch = constrained_batch(RNA, random.Random(11), (20, 37, 52, 64), 64)
    check_against_vienna(layers.turner2004(jnp.float64), batch, pf_rtol=1e-6, mfe_tol=1e-4, bpp_tol=1e-6)


@pytest.mark.slow
def test_turner_grammar_constraints_float32_samples_and_gradients(RNA):
    """float32 within the issue's tolerances; samples satisfy their constraints; the gradient of the
    constrained log Z is finite and equals the expected counts' difference from float64."""
    batch = constrained_batch(RNA, random.Random(12), (40, 53, 64), 64)
    params32 = layers.turner2004(jnp.float32)
    check_against_vienna(params32, batch, pf_rtol=1e-4, mfe_tol=2e-3, bpp_tol=1e-3)
    seqs, constraints, _, tokens, lengths, phi = batch
    samples = np.asarray(layers.sample_structures(jax.random.key(0), params32, tokens, 64, lengths,
                                                  phi=jnp.asarray(phi, jnp.float32)))
    for row, (seq, constraint) in enumerate(zip(seqs, constraints)):
        for table in samples[row, :, :len(seq)]:  # [B, samples, L]
            assert satisfies([(i, int(j)) for i, j in enumerate(table) if j > i], constraint)
    grads = {}
    for dtype in (jnp.float32, jnp.float64):
        params = layers.turner2004(dtype)
        grads[dtype] = jax.grad(lambda p, dtype=dtype: jnp.sum(layers.log_partition(
            p, tokens, lengths, phi=jnp.asarray(phi, dtype))))(params)
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads[dtype]))
    for g32, g64 in zip(jax.tree.leaves(grads[jnp.float32]), jax.tree.leaves(grads[jnp.float64])):
        np.testing.assert_allclose(np.asarray(g32), np.asarray(g64), atol=2e-3 * max(1.0, np.abs(g64).max()))


def satisfies_enforced(pairs, constraint: str) -> bool:
    """``--enforceConstraint``: the constraint, and every ``( )`` pair formed, every ``|`` paired."""
    partner = {}
    for i, j in pairs:
        partner[i], partner[j] = j, i
    opened = []
    for pos, symbol in enumerate(constraint):
        if symbol == "|" and pos not in partner:
            return False
        if symbol == "(":
            opened.append(pos)
        elif symbol == ")" and partner.get(opened.pop()) != pos:
            return False
    return satisfies(pairs, constraint)


def test_enforced_constraints_match_the_enumeration_stacking_grammar():
    """The stacking grammar with ``constraint_phi(..., enforce=True)``: log Z minus the bonus, pair
    probabilities and the best structure are the float64 enumeration's over the structures that meet
    the enforced constraint (large random scores, float64 and float32)."""
    rng = random.Random(21)
    params = random_params(np.random.default_rng(21), scale=3.0)
    n = 12
    tokens = np.array([rng.randrange(4) for _ in range(n)], np.int32)
    structures = list(enumerate_structures(n, 3))
    checked = 0
    while checked < 3:
        constraint = random_constraint(rng, n, rate=0.2)
        kept = [s for s in structures if satisfies_enforced(s, constraint)]
        if not kept or "|" not in constraint and "(" not in constraint:
            continue
        checked += 1
        scores, want, probs = enumerated_ensemble(params, tokens, kept, n)
        bonus = layers.enforced_bonus(constraint)
        for dtype, tol in ((jnp.float64, 1e-9), (jnp.float32, 2e-4)):
            p = jax.tree.map(lambda a, dtype=dtype: jnp.asarray(a, dtype), params)
            phi = jnp.asarray(layers.constraint_phi(constraint, enforce=True), dtype)
            got = float(layers.log_partition(p, tokens, phi=phi)) - bonus
            assert got == pytest.approx(want, rel=tol, abs=tol * max(1.0, bonus / 100)), constraint
            np.testing.assert_allclose(np.asarray(layers.pair_probs(p, tokens, phi=phi)), probs, atol=10 * tol)
            best = np.asarray(layers.best_structure(p, tokens, phi=phi))
            best_pairs = [(i, int(j)) for i, j in enumerate(best) if j > i]
            assert satisfies_enforced(best_pairs, constraint)
            assert float(layers.max_score(p, tokens, phi=phi)) - layers.enforced_bonus(constraint, best) == \
                pytest.approx(scores.max(), rel=tol, abs=tol * max(1.0, bonus / 100))


def test_turner_grammar_matches_vienna_enforced_constraints(RNA):
    """float64, ``enforce=True`` against ViennaRNA's ``CONSTRAINT_DB_ENFORCE_BP``: ensemble free energy
    (log Z minus the bonus), MFE and pair probabilities; the best structure meets every element."""
    rng = random.Random(31)
    seqs, constraints = [], []
    for n in (24, 41, 57, 64):
        seq = random_sequence(rng, n, "GGCCAU")
        fc = RNA.fold_compound(seq, vienna_md(RNA))
        fc.mfe()
        fc.pf()
        RNA.init_rand(rng.randrange(1 << 30))
        table = layers.from_dot_bracket(fc.pbacktrack())
        pairs = [(i, int(j)) for i, j in enumerate(table) if j > i]
        symbols = list(random_constraint(rng, n, pairs, rate=0.0))
        for pos in rng.sample([p for p in range(n) if table[p] >= 0 and symbols[p] == "."], 2):
            symbols[pos] = "|"  # bases paired in a sample, so the constraint can be met
        seqs.append(seq)
        constraints.append("".join(symbols))
    tokens, lengths = padded(seqs, 64, seed=4)
    with jax.enable_x64(True):
        params = layers.turner2004(jnp.float64)
        phi = jnp.asarray(np.stack([layers.constraint_phi(c, s, length=64, enforce=True)
                                    for c, s in zip(constraints, seqs)]))
        log_z = np.asarray(layers.log_partition(params, tokens, lengths, phi=phi))
        best = np.asarray(layers.best_structure(params, tokens, lengths, phi=phi))
        probs = np.asarray(layers.pair_probs(params, tokens, lengths, phi=phi))
        energies = np.asarray(layers.free_energy(params, tokens, best, lengths))
    for row, (seq, constraint) in enumerate(zip(seqs, constraints)):
        n = len(seq)
        fc = RNA.fold_compound(seq, vienna_md(RNA))
        fc.hc_add_from_db(constraint, RNA.CONSTRAINT_DB_DEFAULT | RNA.CONSTRAINT_DB_ENFORCE_BP)
        _, mfe = fc.mfe()
        fc.exp_params_rescale(mfe)
        fc.pf()
        assert -KT * (log_z[row] - layers.enforced_bonus(constraint)) == pytest.approx(vienna_pf_result(fc), abs=1e-6)
        pairs = [(i, int(j)) for i, j in enumerate(best[row][:n]) if j > i]
        assert satisfies_enforced(pairs, constraint), constraint
        assert energies[row] == pytest.approx(mfe, abs=1e-4)
        np.testing.assert_allclose(probs[row, :n, :n], vienna_bpp(fc), atol=1e-6)


def test_fold_command_enforces_constraints_as_rnafold(RNA, capsys, tmp_path):
    """``foldax fold -C --enforceConstraint -p --params turner2004`` prints RNAfold's lines; a constraint
    that cannot be met is named on stderr."""
    records = {"a": ("GGGAAACCCAGGGAAACCCU", ".(.....)..|........."),
               "b": ("GGGAAACCCAGGGAAACCCU", "....|..............."),
               "c": ("GGGAAACCCAGGGAAACCCU", "...|..........|.....")}  # two A's, one U to pair with
    path = tmp_path / "in.fa"
    path.write_text("".join(f">{rid}\n{seq}\n{c}\n" for rid, (seq, c) in records.items()))
    rc, out, err = run(capsys, ["fold", "-C", "--enforceConstraint", "-p", "--params", "turner2004", "-i", path])
    assert rc == 0, err
    assert "has no effect" not in err and "warning: c: the structure meets 50%" in err
    lines = out.splitlines()
    for k, (seq, constraint) in enumerate(list(records.values())[:2]):
        assert_rnafold_lines(lines[6 * k + 2:6 * k + 6], vienna_fold(RNA, seq, constraint=constraint, enforce=True))
    assert lines[2 + 6 * 1].startswith("....(.....(((...))))")  # b: base 5 pairs, against the MFE


def test_fold_command_reports_bad_constraints(capsys, tmp_path):
    path = tmp_path / "in.fa"
    path.write_text(">a\nGGGGAAACCCC\n..q........\n>b\nGGGGAAACCCC\n(.........)\n>c\nGGGGAAACCCA\n(.........)\n"
                    ">d\nGGGGAAACCCC\n(...\n")
    rc, out, err = run(capsys, ["fold", "-C", "-i", path])
    assert rc == 1 and out == ""
    assert f"{path}:3: record 'a': constraint: unknown symbol 'q' at position 3" in err
    assert f"{path}:9: record 'c': constraint pairs positions 1 and 11 (1-based), G-A" in err
    assert f"{path}:12: record 'd': constraint has length 4 but the sequence has 11" in err
    assert "record 'b'" not in err and "3 invalid record(s); nothing folded" in err
    rc, out, err = run(capsys, ["fold", "--enforceConstraint", "-i", path])
    assert rc == 2 and out == "" and "--enforceConstraint needs -C" in err
    # without -C the same lines are reference structures (or, with a 'q', not a structure)
    rc, _, err = run(capsys, ["fold", "-i", path])
    assert rc == 1 and "constraint" not in err


@pytest.mark.slow
def test_fold_command_constraints_print_rnafold_numbers(RNA, capsys, tmp_path):
    """``foldax fold -C -p --params turner2004`` prints RNAfold -C -p's lines; the default model and the
    stacking model obey the constraint; '|' is reported as having no effect."""
    records = {"one": ("GGGGAAACCCCAUGGAAACCAUGCAUGCGGAAACGCUU", "xxxx......<.....>....|............x..."),
               "two": ("AGUCCGAGGAGAGGGUGCUUCAGAGUAUGUAUACCACUGG", "..(.............................).......")}
    path = tmp_path / "in.fa"
    path.write_text("".join(f">{rid}\n{seq}\n{c}\n" for rid, (seq, c) in records.items()))
    rc, out, err = run(capsys, ["fold", "-C", "-p", "--params", "turner2004", "-i", path])
    assert rc == 0, err
    assert "'|' (must pair) has no effect" in err and "one: 22" in err and "two:" not in err
    lines = out.splitlines()
    for k, (seq, constraint) in enumerate(records.values()):
        want = vienna_fold(RNA, seq, constraint=constraint)
        assert_rnafold_lines(lines[6 * k + 2:6 * k + 6], want)
        unconstrained = vienna_fold(RNA, seq)
        assert (want["structure"], want["ensemble"]) != (unconstrained["structure"], unconstrained["ensemble"])
    for params in (["--params", "handset"], []):
        rc, out, err = run(capsys, ["fold", "-C", "-i", path, *params] if params else
                           ["fold", "-C", "-i", path, "--params", "turner2004+turner1999+stacking"])
        assert rc == 0, err
        lines = out.splitlines()
        for k, (seq, constraint) in enumerate(records.values()):
            table = layers.from_dot_bracket(lines[3 * k + 2].split()[0])
            assert satisfies([(i, int(j)) for i, j in enumerate(table) if j > i], constraint)
