"""JAX Turner 2004 evaluator (layers/energy.py) against the float64 reference and ViennaRNA.

Compiled (the evaluator is always jitted), batched with mixed lengths and garbage in the padding,
float64 and float32, eval and pf energies, validity flags, gradients against finite differences
of the independent NumPy reference, and no NaN with the tables' +inf entries. One padded shape
per group of tests keeps the number of compilations (a few seconds each) small.
"""

from __future__ import annotations

import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from vienna_helpers import (
    constructed_cases,
    fit_sequence,
    pbacktrack_cases,
    random_shape,
    special_hairpin_cases,
    vienna_md,
    vienna_rna_sequence,
)

from foldax.layers.alphabet import encode
from foldax.layers.dotbracket import from_dot_bracket
from foldax.layers.energy import _extrapolation, loop_energy
from foldax.layers.energy_params import CLIPPED_TABLES, MAX_LOOP, SCALAR_NAMES, TABLE_SHAPES, load_parameter_file, turner2004
from foldax.layers.energy_reference import as_pair_table, numpy_params, reference_free_energy, reference_loop_energies

jax.config.update("jax_enable_x64", True)


def pad_batch(cases, width, rng):
    """tokens, pair tables and lengths [B, width]; padding holds random tokens and partners."""
    batch = len(cases)
    tokens = rng.integers(0, 5, size=(batch, width)).astype(np.int32)
    pairs = rng.integers(-1, width, size=(batch, width)).astype(np.int32)
    lengths = np.zeros(batch, np.int32)
    for b, (seq, structure) in enumerate(cases):
        n = len(seq)
        tokens[b, :n] = encode(seq)
        pairs[b, :n] = as_pair_table(structure, n)
        lengths[b] = n
    return tokens, pairs, lengths


def grammar_valid(params, seq, structure) -> bool:
    """The Turner grammar's conditions, from the reference's loop decomposition."""
    for loop in reference_loop_energies(params, seq, structure):
        if loop.energy == math.inf:
            return False
        if loop.kind in ("stack", "bulge", "interior"):
            (i, j), ((k, l),) = loop.pair, loop.inner
            if (k - i - 1) + (j - l - 1) > MAX_LOOP:
                return False
    return True


def assert_energies(got, cases, params, *, pf=False, atol=1e-9, rtol=0.0):
    got = np.asarray(got, dtype=np.float64)
    for b, (seq, structure) in enumerate(cases):
        expected = reference_free_energy(params, seq, structure, pf=pf)
        if expected == math.inf:
            assert got[b] == math.inf, (seq, structure, got[b])
        else:
            assert abs(got[b] - expected) <= atol + rtol * abs(expected), (seq, structure, got[b], expected)


@pytest.fixture(scope="module")
def turner64():
    return turner2004(jnp.float64)


@pytest.fixture(scope="module")
def big_batch():
    """~350 cases, n <= 250: every loop type, every special hairpin, random shapes, padded to 256."""
    rng = random.Random(21)
    params = numpy_params(turner2004(jnp.float64))
    cases = constructed_cases(rng, max_loop=None) + special_hairpin_cases(params)
    cases = [c for c in cases if len(c[0]) <= 256]
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(0, 250)) for _ in range(60))]
    return cases, pad_batch(cases, 256, np.random.default_rng(0))


# --------------------------------------------------------------------------- #
# values
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("pf", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_float64_equals_reference(big_batch, turner64, pf):
    cases, (tokens, pairs, lengths) = big_batch
    energy, valid = loop_energy(turner64, tokens, pairs, lengths, pf=pf)
    assert energy.dtype == jnp.float64 and energy.shape == (len(cases),)
    params = numpy_params(turner64)
    assert_energies(energy, cases, params, pf=pf)
    assert np.asarray(valid).tolist() == [grammar_valid(params, s, db) for s, db in cases]
    assert not np.asarray(valid).all() and np.asarray(valid).sum() > 200  # both kinds present


def test_float32_equals_vienna(big_batch):
    RNA = pytest.importorskip("RNA")
    RNA.params_load_RNA_Turner2004()
    cases, (tokens, pairs, lengths) = big_batch
    energy, _ = loop_energy(turner2004(jnp.float32), tokens, pairs, lengths)
    assert energy.dtype == jnp.float32
    md = vienna_md(RNA)
    for b, (seq, db) in enumerate(cases):
        expected = RNA.fold_compound(vienna_rna_sequence(seq), md).eval_structure_pt(RNA.ptable(db)) / 100
        assert abs(float(energy[b]) - expected) <= 1e-4 * max(1.0, abs(expected)), (seq, db)


def test_padding_and_batch_composition_do_not_matter(big_batch, turner64):
    cases, (tokens, pairs, lengths) = big_batch
    energy, valid = loop_energy(turner64, tokens, pairs, lengths)
    # other padding, reversed order: same values (same shapes, so no new compilation)
    tokens2, pairs2, lengths2 = pad_batch(cases[::-1], 256, np.random.default_rng(1))
    energy2, valid2 = loop_energy(turner64, tokens2, pairs2, lengths2)
    np.testing.assert_array_equal(np.asarray(energy2)[::-1], np.asarray(energy))
    np.testing.assert_array_equal(np.asarray(valid2)[::-1], np.asarray(valid))


@pytest.fixture(scope="module")
def small_batch():
    """Valid and invalid structures, n <= 60, padded to 64."""
    rng = random.Random(5)
    valid = [
        (fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 60), max_loop=30) for _ in range(14))
    ]
    valid += [(fit_sequence(rng, "((" + "." * 36 + "))"), "((" + "." * 36 + "))")]  # hairpin > 30
    valid += [
        ("GCUUCGGC", "((....))"),
        ("GGCAACGCC", ".((...))."),
        ("GACAGUACUC", "((......))"),
        ("GGAAGCAAAGCAAACC", "((..((...))...))"),
    ]
    invalid = [
        ("GGGAACCC", "(((..)))"),  # hairpin of 2
        ("GGGAAACCA", "(((...)))"),  # G-A pair
        ("GGNGAAACCC", "(((....)))"),  # N in a pair
        ("GG" + "A" * 31 + "GGGAAACCC" + "CC", "((" + "." * 31 + "(((...)))" + "))"),  # bulge of 31
        ("GG" + "A" * 20 + "GGGAAACCC" + "A" * 11 + "CC", "((" + "." * 20 + "(((...)))" + "." * 11 + "))"),  # 20 + 11
    ]
    cases = valid + invalid
    tokens, pairs, lengths = pad_batch(cases, 64, np.random.default_rng(2))
    return cases, (tokens, pairs, lengths), len(valid)


def _weighted_sum(params, weights, tokens, pairs, lengths, pf):
    """sum_b w_b E_b over the rows with w_b != 0 (others masked out, +inf or not), with the
    energies and validity flags as auxiliary output."""
    energy, valid = loop_energy(params, tokens, pairs, lengths, pf=pf)
    return jnp.sum(jnp.where(weights != 0, weights * energy, 0.0)), (energy, valid)


# one compilation per pf for every test on the small batch's shape
weighted_value_and_grad = jax.jit(jax.value_and_grad(_weighted_sum, has_aux=True), static_argnames="pf")


def test_validity_and_infinite_energies(small_batch, turner64):
    cases, (tokens, pairs, lengths), n_valid = small_batch
    (_, (energy, valid)), _ = weighted_value_and_grad(turner64, np.zeros(len(cases)), tokens, pairs, lengths, False)
    assert np.asarray(valid).tolist() == [True] * n_valid + [False] * (len(cases) - n_valid)
    assert_energies(energy, cases, numpy_params(turner64))
    assert np.isinf(np.asarray(energy)[n_valid : n_valid + 3]).all()  # short hairpin, G-A, N
    assert np.isfinite(np.asarray(energy)[n_valid + 3 :]).all()  # large loops: extrapolated


def test_malformed_pair_tables_are_invalid(small_batch, turner64):
    cases, (tokens, pairs, lengths), _ = small_batch
    tokens, pairs, lengths = tokens.copy(), pairs.copy(), lengths.copy()
    malformed = [
        ("GGAAAACCAAAA", [6, 7, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1]),  # crossing (0, 6), (1, 7)
        ("GAAC", [3, -1, -1, 1]),  # asymmetric
        ("GGGAAACC", [9, -1, -1, -1, -1, -1, -1, -1]),  # partner beyond the length
        ("GAAAC", [-1, -1, 2, -1, -1]),  # self pair
        ("GAAAC", [-7, -1, -1, -1, -1]),  # out of range
    ]
    for row, (seq, table) in enumerate(malformed):
        n = len(seq)
        tokens[row, :n], pairs[row, :n], lengths[row] = encode(seq), table, n
    pairs[2, 9] = 0  # the padding "answers" the pair reaching into it: still invalid
    weights = np.zeros(len(cases))
    (_, (energy, valid)), _ = weighted_value_and_grad(turner64, weights, tokens, pairs, lengths, False)
    assert not np.asarray(valid)[: len(malformed)].any()
    assert np.isinf(np.asarray(energy)[: len(malformed)]).all()
    (_, (reference, _)), _ = weighted_value_and_grad(turner64, weights, *small_batch[1], False)
    np.testing.assert_array_equal(np.asarray(energy)[5:], np.asarray(reference)[5:])


def test_unbatched_and_vmap(turner64):
    seqs = ["GGGGAAACCCCA", "GCUUCGGCAAAA", "NGGGAAACCCNA"]  # one length: one compilation
    dbs = [
        "((((...)))).",
        "((....))....",
        ".(((...)))..",
    ]
    singles = [loop_energy(turner64, encode(s), from_dot_bracket(d)) for s, d in zip(seqs, dbs)]
    for (e, v), s, d in zip(singles, seqs, dbs):
        assert e.shape == () and bool(v)
        assert float(e) == pytest.approx(reference_free_energy(turner64, s, d), abs=1e-9)
    tokens, pairs, lengths = pad_batch(list(zip(seqs, dbs)), 24, np.random.default_rng(3))
    vmapped = jax.vmap(lambda t, p, n: loop_energy(turner64, t, p, n)[0])(tokens, pairs, lengths)
    np.testing.assert_allclose(np.asarray(vmapped), [float(e) for e, _ in singles], rtol=0, atol=1e-12)


def test_float32_truncation_of_large_loops_matches_float64():
    """trunc(100 lxc ln(n/30)) in float32 gives ViennaRNA's integers for every n up to 4096."""
    n = jnp.arange(0, 4097)
    for dtype in (jnp.float32, jnp.float64):
        params = {"lxc": jnp.asarray(1.07856, dtype)}
        got = np.asarray(jax.jit(lambda p, n: _extrapolation(p, n, truncate=True))(params, n), np.float64)
        expected = np.where(n > 30, np.trunc(107.856 * np.log(np.maximum(n, 30) / 30)) / 100, 0.0)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- #
# gradients
# --------------------------------------------------------------------------- #


def _random_params(seed: int) -> dict:
    """Finite random tables (+inf where Turner 2004 has it), ninio > max_ninio, float64."""
    rng = np.random.default_rng(seed)
    base = numpy_params(turner2004(jnp.float64))
    params = {}
    for key in list(TABLE_SHAPES) + list(SCALAR_NAMES):
        value = base[key]
        noise = rng.normal(0.0, 2.0, size=np.shape(value))
        params[key] = jnp.asarray(np.where(np.isinf(value), np.inf, noise))

    def f64(value):  # not weakly typed: no recompilation
        return jnp.asarray(value, jnp.float64)

    params["lxc"], params["ninio"], params["max_ninio"] = f64(1.3), f64(0.83), f64(2.9)
    params["special_hairpins"] = {k: f64(rng.normal(0.0, 2.0)) for k in base["special_hairpins"]}
    return params


def _direction(params, key, rng):
    """A random direction that moves only table ``key`` (and never its inf entries)."""
    out = jax.tree.map(jnp.zeros_like, params)
    if key == "special_hairpins":
        out[key] = {k: jnp.asarray(rng.normal()) for k in params[key]}
    else:
        value = np.asarray(params[key])
        out[key] = jnp.asarray(np.where(np.isinf(value), 0.0, rng.normal(size=value.shape)))
    return out


@pytest.mark.parametrize("pf", [False, True])
def test_gradients_equal_finite_differences(small_batch, pf):
    """d/dt sum_b w_b E_b(params + t v) at t = 0, by the JAX gradient and by central differences of
    the NumPy reference, for a direction v in each table (special hairpins included); random
    tables with ninio > max_ninio. The energies themselves equal the reference too."""
    cases, (tokens, pairs, lengths), n_valid = small_batch
    params = _random_params(7)
    weights = np.zeros(len(cases))
    weights[:n_valid] = np.random.default_rng(8).normal(size=n_valid)
    (_, (energy, _)), grad = weighted_value_and_grad(params, weights, tokens, pairs, lengths, pf)
    assert_energies(energy, cases, numpy_params(params), pf=pf)
    rng = np.random.default_rng(9)
    eps = 1e-5
    for key in list(TABLE_SHAPES) + list(SCALAR_NAMES) + ["special_hairpins"]:
        v = _direction(params, key, rng)
        analytic = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(v)))
        shifted = [jax.tree.map(lambda p, d, s=s: p + s * eps * d, params, v) for s in (1, -1)]
        plus, minus = (
            sum(w * reference_free_energy(p, seq, db, pf=pf) for w, (seq, db) in zip(weights[:n_valid], cases))
            for p in shifted
        )
        numeric = (plus - minus) / (2 * eps)
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-6), key
    if pf:  # the long hairpin makes lxc matter, untruncated
        assert abs(float(grad["lxc"])) > 1e-3
    else:
        assert float(grad["lxc"]) == 0.0


def test_gradients_are_feature_counts(small_batch, turner64):
    """For one structure the gradient counts the table entries it uses: GCUUCGGC ((....)) uses the
    tetraloop CUUCGG once, stack[GC, GC] once (x[l] = G, x[k] = C), nothing else."""
    cases, (tokens, pairs, lengths), _ = small_batch
    row = cases.index(("GCUUCGGC", "((....))"))
    weights = np.zeros(len(cases))
    weights[row] = 1.0
    _, grad = weighted_value_and_grad(turner64, weights, tokens, pairs, lengths, False)
    assert float(grad["special_hairpins"]["CUUCGG"]) == 1.0
    assert sum(abs(float(v)) for k, v in grad["special_hairpins"].items() if k != "CUUCGG") == 0.0
    stack = np.asarray(grad["stack"])
    assert stack[1, 1] == 1.0 and np.abs(stack).sum() == 1.0
    others = [k for k in list(TABLE_SHAPES) + list(SCALAR_NAMES) if k != "stack"]
    assert all(np.abs(np.asarray(grad[k])).sum() == 0.0 for k in others)


def test_no_nan_with_infinite_entries_and_invalid_structures(small_batch, turner64):
    """Turner's +inf entries and forbidden structures (+inf energies) in one batch: the gradient is
    finite whether the infinite energies are summed or masked out."""
    cases, (tokens, pairs, lengths), _ = small_batch
    (_, (energy, valid)), _ = weighted_value_and_grad(turner64, np.zeros(len(cases)), tokens, pairs, lengths, False)
    assert np.isinf(np.asarray(energy)).any()
    for weights in (np.ones(len(cases)), np.asarray(valid, np.float64)):
        (value, _), grad = weighted_value_and_grad(turner64, weights, tokens, pairs, lengths, False)
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grad))
        assert np.isinf(float(value)) == bool((weights * ~np.asarray(valid)).any())


# --------------------------------------------------------------------------- #
# long sweeps (slow)
# --------------------------------------------------------------------------- #


@pytest.mark.slow
def test_sweep_against_vienna_lengths_1_to_500_float64_and_float32():
    RNA = pytest.importorskip("RNA")
    RNA.params_load_RNA_Turner2004()
    rng = random.Random(31)
    cases = pbacktrack_cases(RNA, rng, [rng.randint(1, 500) for _ in range(100)], 10)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 500)) for _ in range(300))]
    cases += constructed_cases(rng, per_kind=2)
    assert len(cases) >= 2000
    tokens, pairs, lengths = pad_batch(cases, 512, np.random.default_rng(4))
    md = vienna_md(RNA)
    expected = np.array(
        [RNA.fold_compound(vienna_rna_sequence(s), md).eval_structure_pt(RNA.ptable(db)) / 100 for s, db in cases]
    )
    for dtype, tol in ((jnp.float64, 1e-9), (jnp.float32, 1e-4)):
        energy = np.asarray(loop_energy(turner2004(dtype), tokens, pairs, lengths)[0], np.float64)
        np.testing.assert_allclose(energy, expected, rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Andronescu2007", "Langdon2018"])
def test_other_parameter_sets_against_vienna(tmp_path, name):
    RNA = pytest.importorskip("RNA")
    getattr(RNA, f"params_load_RNA_{name}")()
    try:
        path = tmp_path / f"{name}.par"
        assert RNA.params_save(str(path))
        params = load_parameter_file(path, dtype=jnp.float64)
        assert all((np.asarray(params[k]) <= 0).all() for k in CLIPPED_TABLES)
        rng = random.Random(32)
        cases = pbacktrack_cases(RNA, rng, [rng.randint(1, 300) for _ in range(40)], 5)
        cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 300)) for _ in range(100))]
        tokens, pairs, lengths = pad_batch(cases, 320, np.random.default_rng(5))
        md = vienna_md(RNA)
        expected = [
            RNA.fold_compound(vienna_rna_sequence(s), md).eval_structure_pt(RNA.ptable(db)) / 100 for s, db in cases
        ]
        expected = np.where(np.asarray(expected) >= 1e5, np.inf, expected)  # ViennaRNA's INF (Langdon has some)
        energy = loop_energy(params, tokens, pairs, lengths)[0]
        np.testing.assert_allclose(np.asarray(energy), expected, rtol=0, atol=1e-9)
        valid = np.asarray(loop_energy(params, tokens, pairs, lengths)[1], np.float64)
        grad = jax.grad(lambda p: jnp.sum(jnp.where(valid > 0, loop_energy(p, tokens, pairs, lengths)[0], 0.0)))(params)
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grad))
    finally:
        RNA.params_load_RNA_Turner2004()


@pytest.mark.slow
def test_long_sequences_up_to_4000(turner64):
    rng = random.Random(33)
    cases = [
        (fit_sequence(rng, db), db) for db in (random_shape(rng, n, max_loop=30) for n in (4000, 3999, 2500, 1200))
    ]
    tokens, pairs, lengths = pad_batch(cases, 4096, np.random.default_rng(6))
    for dtype, tol in ((jnp.float64, 1e-9), (jnp.float32, 2e-6)):
        energy, valid = loop_energy(turner2004(dtype), tokens, pairs, lengths)
        assert np.asarray(valid).all()
        assert_energies(energy, cases, numpy_params(turner64), atol=tol, rtol=tol)
    grad = jax.grad(lambda p: loop_energy(p, tokens, pairs, lengths)[0].sum())(turner64)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grad))
