"""The top-down traceback (``layers/traceback.py``) against the outside pass of the same
recursion and against exact enumeration, for both grammars.

* best structures: the traceback's structure scores ``max_score`` (ties may pick another
  structure) and, where the maximum is unique, is the outside pass's structure;
* samples: both samplers follow the exact distribution (chi-square against every structure);
  a sample does not depend on the rest of its batch or on how the lanes are grouped.
"""

import collections
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax import layers
from foldax.layers import chart, inside, traceback, turner
from foldax.layers.dotbracket import pairs_from_table, validate_pair_table
from foldax.layers.reference import (
    brute_force_log_partition,
    enumerate_structures,
    random_params,
    structure_score_reference,
)
from compile_flags import default_code_generation_environ
from test_decoding import chi_square_p_value

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def random_rna(rng, n, alphabet="ACGU"):
    return "".join(rng.choice(list(alphabet), size=n))


def stacking(dtype, rng=None):
    params = random_params(rng) if rng is not None else layers.default_params()
    return jax.tree.map(lambda x: jnp.asarray(x, dtype), params)


@pytest.mark.parametrize("grammar, dtype", [("turner", jnp.float32), pytest.param("turner", jnp.float64, marks=pytest.mark.slow),
                                            ("stacking", jnp.float32), ("stacking", jnp.float64)])
def test_best_structure_scores_the_maximum_and_matches_the_outside_pass(grammar, dtype):
    """Random sequences of edge and mixed lengths (0, 1, 5, ..., 90; N letters), random phi, chunked
    charts: the traceback's structure is valid, scores max_score, and equals the outside pass's
    structure wherever the two score alike (the same tie rule, one cell at a time)."""
    rng = np.random.default_rng(3)
    seqs = ["", "A", "GGAAC", random_rna(rng, 31), random_rna(rng, 64, "ACGUN"), random_rna(rng, 90)]
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    phi = jnp.asarray(rng.normal(0, 0.5, tokens.shape + tokens.shape[-1:]), dtype)
    params = layers.turner2004(dtype) if grammar == "turner" else stacking(dtype, rng)
    kw = dict(phi=phi, num_chunks=3)
    fast, fast_best = layers.best_structure(params, tokens, lengths, with_score=True, **kw)
    slow, slow_best = layers.best_structure(params, tokens, lengths, method="outside", with_score=True, **kw)
    fast, slow = np.asarray(fast), np.asarray(slow)
    best = np.asarray(layers.max_score(params, tokens, lengths, **kw))
    scores = np.asarray(layers.structure_score(params, tokens, jnp.asarray(fast), lengths, phi=phi))
    tol = 1e-4 if dtype == jnp.float32 else 1e-9
    for value in (scores, fast_best, slow_best):
        np.testing.assert_allclose(value, best, rtol=tol, atol=tol)
    for b, n in enumerate(lengths):
        validate_pair_table(fast[b, :n], min_hairpin=3)
        assert (fast[b, n:] == -1).all()
    assert (fast == slow).all(axis=1).sum() >= len(seqs) - 1  # a float32 tie at most


@pytest.mark.slow
def test_best_and_mea_structures_without_lonely_pairs_and_with_constraints():
    """The noLP grammar (its pairs' chart rides in the packed multiloop row) and a hard
    constraint (scores of -inf on forbidden pairs) trace back as the outside pass does."""
    rng = np.random.default_rng(5)
    seqs = [random_rna(rng, n) for n in (40, 57, 72)]
    tokens, lengths = layers.encode_batch(seqs, buckets=None)
    params = layers.turner2004(jnp.float64)
    forbidden = jnp.where(jnp.arange(72)[:, None] < 10, layers.FORBIDDEN_PHI, 0.0)  # no pair opens before 10
    for kw in (dict(no_lonely_pairs=True), dict(phi=jnp.broadcast_to(forbidden, (3, 72, 72)))):
        fast = np.asarray(layers.best_structure(params, tokens, lengths, **kw))
        slow = np.asarray(layers.best_structure(params, tokens, lengths, method="outside", **kw))
        np.testing.assert_array_equal(fast, slow)
    probs = layers.pair_probs(params, tokens, lengths)
    for gamma in (0.5, 4.0):
        np.testing.assert_array_equal(layers.mea_structure(probs, lengths, gamma=gamma),
                                      layers.mea_structure(probs, lengths, gamma=gamma, method="outside"))


def exact_fit(tables, params, x, phi, h=3):
    """(p-value, bins) of the samples' structure counts against brute-force probabilities (stacking)."""
    n = len(x)
    counts = collections.Counter(tuple(pairs_from_table(t[:n])) for t in tables)
    structs = [tuple(sorted(s)) for s in enumerate_structures(n, h)]
    assert set(counts) <= set(structs), "a sample outside the folding space"
    log_z = brute_force_log_partition(params, x, phi=phi, min_hairpin=h)
    probs = np.exp([structure_score_reference(params, x, s, phi=phi) - log_z for s in structs])
    return chi_square_p_value(np.array([counts[s] for s in structs]), probs)


@pytest.mark.parametrize("method", ["traceback", "outside"])
def test_both_samplers_follow_the_exact_distribution(method):
    """Stacking grammar, float32, random parameters and phi, two padded sequences: 6,000 samples
    each against every structure's exact probability."""
    rng = np.random.default_rng(11)
    params = stacking(jnp.float32, rng)
    tokens = rng.integers(0, 4, (2, 11))
    lengths = np.array([11, 10])
    phi = rng.normal(0, 1.0, (2, 11, 11)).astype(np.float32)
    tables = np.asarray(layers.sample_structures(jax.random.key(4), params, tokens, 6000, lengths, phi=phi,
                                                 num_chunks=3, method=method))
    assert tables.shape == (2, 6000, 11)
    for b, n in enumerate(lengths):
        assert (tables[b, :, n:] == -1).all()
        p_value, bins = exact_fit(tables[b], jax.tree.map(np.float64, params), tokens[b, :n], phi[b, :n, :n])
        assert bins >= 15 and p_value > 1e-3, (b, p_value, bins)


def test_a_sample_depends_on_its_key_index_and_sequence_only():
    """The same sequence alone, first or second in a batch, or with the lanes split into groups of
    one sample each, draws the same samples; another key draws others."""
    rng = np.random.default_rng(7)
    params = stacking(jnp.float32)
    tokens, lengths = layers.encode_batch([random_rna(rng, 24), random_rna(rng, 30)], buckets=None)
    key = jax.random.key(9)
    both = np.asarray(layers.sample_structures(key, params, tokens, 50, lengths))
    alone = np.asarray(layers.sample_structures(key, params, tokens[:1], 50, lengths[:1]))
    np.testing.assert_array_equal(both[:1], alone)
    problem, inputs = inside.engine_inputs(params, tokens, lengths, None, min_hairpin=3)
    cap = chart.SAMPLE_GROUP_ELEMENTS
    try:
        chart.SAMPLE_GROUP_ELEMENTS = 1  # one sample per group
        grouped = np.asarray(traceback.traceback_tables.__wrapped__(problem, "sample", key, inputs, lengths, 50))
    finally:
        chart.SAMPLE_GROUP_ELEMENTS = cap
    np.testing.assert_array_equal(np.swapaxes(grouped, 0, 1), both)
    other = np.asarray(layers.sample_structures(jax.random.key(10), params, tokens, 50, lengths))
    assert not np.array_equal(other, both)


def test_the_sample_semiring_takes_given_uniforms_in_order():
    """The traceback draws a step's uniforms at once: SampleSemiring(None) counts what a recursion
    takes; given them, each sum and plus picks the term its uniform selects (inverse CDF of the
    shares), in call order; too few are refused."""
    x = jnp.log(jnp.array([[0.2, 0.3, 0.5]]))

    def recursion(sr, x):  # a sum of three terms (shares 0.2 / 0.3 / 0.5), then a plus (0.4 / 0.6)
        return sr.sum(x, axis=1)[0] + sr.plus(x[0, 0], x[0, 1])

    counter = layers.SampleSemiring(None)
    recursion(counter, x)
    assert counter.uniforms_used == 2
    for uniforms, chosen in (((0.6, 0.1), [1, 0, 1]), ((0.1, 0.9), [1, 1, 0]), ((0.35, 0.5), [0, 2, 0])):
        sr = layers.SampleSemiring(None, uniforms=jnp.array(uniforms, x.dtype))
        np.testing.assert_array_equal(jax.grad(lambda x: recursion(sr, x))(x)[0], chosen)
    with pytest.raises(ValueError, match="1 uniforms given, the recursion takes at least 2"):
        recursion(layers.SampleSemiring(None, uniforms=jnp.array([0.5])), x)


def test_the_traceback_names_what_a_grammar_must_provide():
    """A chart whose rows are not written at affine positions of the diagonal is refused by name."""

    class Bent(turner.TurnerGrammar):
        def writes(self, d, length):
            out = super().writes(d, length)
            return {**out, "QMc": (d * d + 1, 0)}

    with pytest.raises(ValueError, match="'QMc'.*affine"):
        traceback._write_geometry(Bent(), 20)


def _run_script(script, *, env, timeout):
    """Runs ``script`` in a Python process of its own (``env``: None for this one's) and checks that
    it printed OK."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


CONSTANT_INPUTS = textwrap.dedent(
    """
    import jax, numpy as np
    from foldax import layers

    params = layers.default_params()
    x = layers.encode("".join(np.random.default_rng(0).choice(list("ACGU"), size=120)))
    samples = jax.jit(lambda: layers.sample_structures(jax.random.key(0), params, x, 10))()
    best = jax.jit(lambda: layers.best_structure(params, x))()
    assert samples.shape == (10, 120) and best.shape == (120,)
    print("OK")
    """
)


def test_the_traceback_of_constant_inputs_is_not_constant_folded():
    """Inputs closed over by ``jax.jit`` are constants of the program. The traceback's root is an
    arg-max over every chart cell of seeds that depend only on the lengths; XLA constant-folded it
    (about 3 s of a 10 s compile at 120 nt, and a slow-operation alarm on stderr)."""
    proc = _run_script(CONSTANT_INPUTS, env=None, timeout=600)
    assert "Constant folding" not in proc.stderr, proc.stderr[-3000:]


#: Run in a process of its own with XLA's default optimisation (tests/compile_flags.py): as users'
#: programs compile, and the traceback's many small loop steps run 5x slower without it.
REALISTIC = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, RNA
    from foldax import layers

    rng = np.random.default_rng(12)
    seqs = ["".join(rng.choice(list("ACGU"), size=n)) for n in (180, 250)]
    params = layers.turner2004(jnp.float32)
    tokens, lengths = layers.encode_batch(seqs)
    best = layers.best_structure(params, tokens, lengths)
    energy = np.asarray(layers.free_energy(params, tokens, best, lengths))
    probs = np.asarray(layers.pair_probs(params, tokens, lengths))
    samples = np.asarray(layers.sample_structures(jax.random.key(3), params, tokens, 1000, lengths))
    for b, seq in enumerate(seqs):
        md = RNA.md()
        md.uniq_ML = 1
        mfe = RNA.fold_compound(seq, md).mfe()[1]
        assert abs(energy[b] - mfe) <= 1e-3, (seq, float(energy[b]), mfe)
        n = len(seq)
        freq = np.zeros((n, n))
        for table in samples[b]:
            i = np.flatnonzero(table[:n] > np.arange(n))
            freq[i, table[i]] += 1 / len(samples[b])
        p = np.triu(probs[b, :n, :n], 1)
        sigma = np.sqrt(p * (1 - p) / len(samples[b]))
        assert np.all(np.abs(freq - p) <= 5 * sigma + 0.01), (n, float(np.max(np.abs(freq - p))))
    print("OK")
    """
)


@pytest.mark.slow
def test_realistic_lengths_against_vienna_and_pair_probs():
    """As shipped (float32, automatic chunks, length bucket 256, XLA's default optimisation): the
    traceback's best structures have ViennaRNA's MFE energies, and 1,000 samples' pair frequencies
    match pair_probs."""
    pytest.importorskip("RNA")
    _run_script(REALISTIC, env=default_code_generation_environ(), timeout=1800)
