"""The Turner 2004 grammar through the public API, against ViennaRNA 2.x (issue 11, "Exactness").

Only ``layers.*`` is exercised (``free_energy``, ``ensemble_free_energy``, ``log_partition``,
``max_score``, ``pair_probs``, ``best_structure``, ``sample_structures``, ``structure_score``,
``log_prob``, ``load_parameter_file``), so these tests guard any rewrite of the recursion.
Oracles:

* ``fc.eval_structure_pt`` (exact integer dcal/mol) for the energy of a structure, and summed
  over every structure of a short sequence (``enumerate_turner_structures``: ViennaRNA's folding
  space) for brute-force partition functions, feature counts and sampling;
* ViennaRNA's ``fc.pf()`` (``md.pf_smooth = 0``, read in double precision), ``fc.mfe()``,
  ``fc.bpp()``, and soft constraints ``fc.sc_add_bp(i + 1, j + 1, e)`` for ``phi = -e / kT``
  (tests/vienna_helpers.py);
* central finite differences in float64 for first and second derivatives.

Compilation dominates the run time: every padded shape, dtype, function and phi-or-not is a
new program (5-30 s each for the Turner grammar on a 2-core CPU). So the fast tests share one
shape (``BATCH`` sequences padded to ``WIDTH``, float64, plus one float32 call), and the slow ones
add a medium bucket (several diagonal chunks), n = 2,000, and the derivative programs.
"""

from __future__ import annotations

import collections
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import chi2
from vienna_helpers import (
    CANONICAL,
    constructed_cases,
    dot_bracket,
    fit_sequence,
    pbacktrack_cases,
    random_shape,
    save_vienna_parameter_sets,
    special_hairpin_cases,
    vienna_bpp,
    vienna_fold_compound,
    vienna_md,
    vienna_pf_result,
    vienna_rna_sequence,
)

from foldax import layers
from foldax.layers.dotbracket import StructureError
from foldax.layers.energy_reference import enumerate_turner_structures

jax.config.update("jax_enable_x64", True)

KT = layers.KT
#: The fast tests' shape: BATCH sequences padded to WIDTH (one diagonal chunk, room for a
#: hairpin of more than 30 nt).
BATCH, WIDTH = 8, 48
#: Slow buckets: several diagonal chunks (default chunking), and the issue's longest length.
MEDIUM, LONG = 96, 2048
#: float64 calls at the fast shape pass phi (zeros when unused), so that they all share one
#: program per function; the float32 and unbatched calls go without (phi=None).
ZEROS = np.zeros((BATCH, WIDTH, WIDTH))


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def RNA():
    """The ViennaRNA module with Turner 2004 loaded (tests that load other sets restore it)."""
    module = pytest.importorskip("RNA")
    module.params_load_RNA_Turner2004()
    yield module
    module.params_load_RNA_Turner2004()


@pytest.fixture(scope="module")
def turner64():
    return layers.turner2004(jnp.float64)


def padded(seqs, width, *, seed=0):
    """``layers.encode_batch`` to ``width``, the padding overwritten with random letters
    (padding must never matter); returns int32 tokens [B, width] and lengths [B]."""
    tokens, lengths = layers.encode_batch(seqs, buckets=(width,))
    assert tokens.shape == (len(seqs), width), "a sequence is longer than the bucket"
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 5, size=tokens.shape)
    tokens = np.where(np.arange(width)[None, :] < lengths[:, None], tokens, noise)
    return tokens.astype(np.int32), lengths


def random_sequence(rng: random.Random, n: int, letters: str = "ACGU") -> str:
    return "".join(rng.choice(letters) for _ in range(n))


def special_hairpin_sequence(params, size: int) -> str:
    """A sequence folding into a helix closed by the first special hairpin of ``size`` letters
    (a plain hairpin of that size if the parameter set has none, e.g. Andronescu 2007 triloops)."""
    keys = sorted(k for k in params["special_hairpins"] if len(k) == size)
    return "GGA" + (keys[0] if keys else "C" + "A" * (size - 2) + "G") + "UCC"


def soft_constraints(rng: random.Random, seq: str, width: int, *, rate=0.3):
    """Random pair energies ``e`` (multiples of 0.01 kcal/mol, so that ViennaRNA's integer MFE
    holds them exactly) on canonical pairs, as ``[(i, j, e)]`` and ``phi [width, width] =
    -e / kT``; ``phi`` also gets noise where no pair can form (too close, non-canonical, past
    the length), which must change nothing."""
    seq_u = vienna_rna_sequence(seq)
    phi = np.zeros((width, width))
    pairs = []
    for i in range(width):
        for j in range(i + 1, width):
            if j < len(seq) and j - i > 3 and seq_u[i] + seq_u[j] in CANONICAL:
                if rng.random() < rate:
                    e = rng.randint(-300, 300) / 100
                    pairs.append((i, j, e))
                    phi[i, j] = -e / KT
            elif rng.random() < 0.2:
                phi[i, j] = rng.gauss(0.0, 3.0)
    return pairs, phi


def vienna_results(RNA, seqs, soft=None):
    """ViennaRNA's (G, MFE, MFE structure, bpp [n, n]) for each sequence (with soft constraints)."""
    out = []
    for b, seq in enumerate(seqs):
        if not seq:
            out.append((0.0, 0.0, "", np.zeros((0, 0))))
            continue
        fc, structure, mfe = vienna_fold_compound(RNA, seq, soft_pairs=soft[b] if soft else ())
        out.append((vienna_pf_result(fc), mfe, structure, vienna_bpp(fc)))
    return out


def assert_ensemble_energies(got, expected, rel, context=""):
    """|G - G_vienna| <= rel * max(kT, |G_vienna|): relative in G, absolute in ln Q near 0."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    err = np.abs(got - expected) / np.maximum(KT, np.abs(expected))
    assert np.all(err <= rel), (context, got, expected, err.max())


def assert_pair_probs(got, expected_list, lengths, atol):
    got = np.asarray(got, np.float64)
    for b, expected in enumerate(expected_list):
        n = int(lengths[b])
        np.testing.assert_allclose(got[b, :n, :n], expected, rtol=0, atol=atol, err_msg=f"sequence {b}")
        assert not got[b, n:].any() and not got[b, :, n:].any(), "pair probabilities on padding"


def vienna_structure_weights(RNA, seq, phi=None, md=None):
    """Every structure of the Turner folding space of ``seq`` with its log-weight
    ``-E(s)/kT + SUM phi`` (E from ViennaRNA's eval; structures it gives INF are left out).

    ViennaRNA's pf equals SUM exp(-eval/kT) except for hairpins > 30 nt (the pf extrapolates
    their length term untruncated) and 2x3 loops when ninio > max_ninio (the pf caps their
    ninio term, eval does not): neither occurs for n <= 18 with ninio <= max_ninio, which the
    callers ensure."""
    fc = RNA.fold_compound(vienna_rna_sequence(seq), md or vienna_md(RNA))
    structures, weights = [], []
    for pairs in enumerate_turner_structures(seq):
        energy = fc.eval_structure_pt(RNA.ptable(dot_bracket(pairs, len(seq)))) / 100
        if energy >= 1e5:  # ViennaRNA's INF (a forbidden loop, Langdon 2018)
            continue
        bonus = 0.0 if phi is None else sum(phi[i, j] for i, j in pairs)
        structures.append(pairs)
        weights.append(-energy / KT + bonus)
    return structures, np.asarray(weights)


def pair_tables(structures, width):
    """Lists of 0-based pairs -> int32 pair tables [S, width]."""
    tables = np.full((len(structures), width), -1, np.int32)
    for s, pairs in enumerate(structures):
        for i, j in pairs:
            tables[s, i], tables[s, j] = j, i
    return tables


def perturbed(params, seed, *, std, scale=1.0):
    """``scale * params`` plus N(0, std^2) kcal/mol on every finite entry (special hairpins and
    scalars included); ``lxc``, ``ninio``, ``max_ninio`` stay positive and ninio <= max_ninio."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, value in params.items():
        if key == "special_hairpins":
            out[key] = {k: jnp.asarray(scale * float(v) + rng.normal(0, std), v.dtype) for k, v in value.items()}
            continue
        v = np.asarray(value, np.float64)
        noisy = np.where(np.isinf(v), np.inf, scale * v + rng.normal(0, std, v.shape))
        out[key] = jnp.asarray(noisy, value.dtype)
    for key in ("lxc", "ninio", "max_ninio"):
        out[key] = jnp.abs(out[key])
    out["max_ninio"] = jnp.maximum(out["max_ninio"], out["ninio"])
    return out


def table_keys(params):
    return [k for k in params if k != "special_hairpins"] + ["special_hairpins"]


def direction(params, key, rng):
    """A random tangent that moves only ``params[key]`` (never its +inf entries)."""
    out = jax.tree.map(jnp.zeros_like, params)
    if key == "special_hairpins":
        out[key] = {k: jnp.asarray(rng.normal(), v.dtype) for k, v in params[key].items()}
    else:
        value = np.asarray(params[key])
        out[key] = jnp.asarray(np.where(np.isinf(value), 0.0, rng.normal(size=value.shape)), value.dtype)
    return out


def shifted(params, tangent, eps):
    return jax.tree.map(lambda p, t: p + eps * t, params, tangent)


def tree_vdot(a, b):
    return sum(float(jnp.sum(jnp.where(y != 0, x * y, 0.0))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def assert_all_finite(tree, context=""):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        assert np.isfinite(np.asarray(leaf)).all(), (context, jax.tree_util.keystr(path))


# --------------------------------------------------------------------------- #
# the fast shape: BATCH sequences padded to WIDTH
# --------------------------------------------------------------------------- #


def fast_sequences(params):
    rng = random.Random(1101)
    return [
        "",  # empty: log Z = 0, nothing to fold
        "G",
        "GGGAAAUCC",  # the shortest kind of fold
        "ACGUNRYKMSWBDHVacgutGGGAAACCC",  # IUPAC codes read as N, lower case, T
        special_hairpin_sequence(params, 5) + "A" + special_hairpin_sequence(params, 6)
        + special_hairpin_sequence(params, 8),  # a tri-, a tetra- and a hexaloop
        "GGGGCC" + "A" * 34 + "GGCCCC",  # a hairpin of 34: truncated in MFE/eval only
        random_sequence(rng, 37, "GGCCAU"),  # GC-rich: many structures, multiloops
        random_sequence(rng, WIDTH, "ACGUN"),  # the full width, with N
    ]


@pytest.fixture(scope="module")
def fast_batch(RNA, turner64):
    seqs = fast_sequences(turner64)
    assert len(seqs) == BATCH and max(map(len, seqs)) == WIDTH
    tokens, lengths = padded(seqs, WIDTH)
    return seqs, tokens, lengths, vienna_results(RNA, seqs)


def test_kt_is_viennas(RNA):
    fc, _, _ = vienna_fold_compound(RNA, "GGGGAAACCCC")
    assert KT == pytest.approx(fc.exp_params.kT / 1000, rel=1e-12)


def test_ensemble_free_energy_equals_vienna_pf(fast_batch, turner64):
    seqs, tokens, lengths, vienna = fast_batch
    expected = [v[0] for v in vienna]
    got64 = layers.ensemble_free_energy(turner64, tokens, lengths, phi=ZEROS)
    assert got64.dtype == jnp.float64 and got64.shape == (BATCH,)
    assert_ensemble_energies(got64, expected, 1e-6)
    np.testing.assert_allclose(np.asarray(layers.log_partition(turner64, tokens, lengths, phi=ZEROS)),
                               -np.asarray(got64) / KT, rtol=1e-15)
    got32 = layers.ensemble_free_energy(layers.turner2004(jnp.float32), tokens, lengths)
    assert got32.dtype == jnp.float32
    assert_ensemble_energies(got32, expected, 1e-4)


def test_log_partition_equals_brute_force(RNA, turner64):
    """log Z = log SUM_s exp(-E(s)/kT) over every structure, E from ViennaRNA's eval (n <= 14;
    n = 15..18 in the slow sweep)."""
    rng = random.Random(7)
    seqs = [random_sequence(rng, n, "ACGUN" if n % 3 == 0 else "GGCCAU" if n % 3 == 1 else "ACGU")
            for n in (4, 7, 9, 10, 11, 12, 13, 14)]
    tokens, lengths = padded(seqs, WIDTH, seed=1)
    got = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=ZEROS))
    for b, seq in enumerate(seqs):
        structures, weights = vienna_structure_weights(RNA, seq)
        assert len(structures) > (1 if len(seq) > 4 else 0)
        assert got[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), seq


def test_log_partition_with_phi_equals_brute_force(RNA, turner64):
    """The same with random phi (only pairs of the folding space count)."""
    rng = random.Random(8)
    seqs = [random_sequence(rng, n, "GGCCAU") for n in (5, 8, 9, 10, 11, 12, 13, 14)]
    tokens, lengths = padded(seqs, WIDTH, seed=2)
    phi = np.random.default_rng(3).normal(0.0, 1.5, size=(BATCH, WIDTH, WIDTH))
    got = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=phi))
    for b, seq in enumerate(seqs):
        _, weights = vienna_structure_weights(RNA, seq, phi=phi[b])
        assert got[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), seq


def test_mfe_and_best_structure_equal_vienna(fast_batch, turner64):
    seqs, tokens, lengths, vienna = fast_batch
    mfe = -KT * np.asarray(layers.max_score(turner64, tokens, lengths))
    best = layers.best_structure(turner64, tokens, lengths, phi=ZEROS)
    energy = np.asarray(layers.free_energy(turner64, tokens, best, lengths))
    for b, seq in enumerate(seqs):
        expected = vienna[b][1]
        assert mfe[b] == pytest.approx(expected, abs=1e-4), (seq, mfe[b], expected)
        assert energy[b] == pytest.approx(expected, abs=1e-4), (seq, layers.to_dot_bracket(best[b]), vienna[b][2])
        assert (np.asarray(best[b, len(seq):]) == -1).all()
    # the hairpin of 34: MFE truncates its extrapolated length term, the partition function does not
    assert vienna[5][2] == "((((((" + "." * 34 + "))))))"


def test_pair_probs_equal_vienna_bpp(fast_batch, turner64):
    seqs, tokens, lengths, vienna = fast_batch
    probs = layers.pair_probs(turner64, tokens, lengths, phi=ZEROS)
    assert probs.dtype == jnp.float64
    assert_pair_probs(probs, [v[3] for v in vienna], lengths, atol=1e-6)
    assert np.asarray(probs).max() > 0.9  # strong pairs present: the comparison is not vacuous


def test_phi_equals_vienna_soft_constraints(RNA, fast_batch, turner64):
    """phi[i, j] = -e/kT for fc.sc_add_bp(i+1, j+1, e): partition function, pair probabilities,
    and the MFE structure (energy of best_structure minus kT SUM phi) all match."""
    seqs, tokens, lengths, _ = fast_batch
    rng = random.Random(9)
    soft, phis = zip(*(soft_constraints(rng, seq, WIDTH) for seq in seqs))
    phi = np.stack(phis)
    assert sum(map(len, soft)) > 50
    vienna = vienna_results(RNA, seqs, soft)
    assert_ensemble_energies(layers.ensemble_free_energy(turner64, tokens, lengths, phi=phi), [v[0] for v in vienna],
                             1e-6)
    assert_pair_probs(layers.pair_probs(turner64, tokens, lengths, phi=phi), [v[3] for v in vienna], lengths, 1e-6)
    best = np.asarray(layers.best_structure(turner64, tokens, lengths, phi=phi))
    energy = np.asarray(layers.free_energy(turner64, tokens, best, lengths))
    for b in range(BATCH):
        bonus = sum(phi[b, i, j] for i, j in enumerate(best[b]) if j > i)
        assert energy[b] - KT * bonus == pytest.approx(vienna[b][1], abs=1e-4), seqs[b]


def test_padding_and_batch_order_change_nothing(fast_batch, turner64):
    """Other padding (N instead of random letters, random phi there) and a reversed batch give
    the same values, pair probabilities and best structures."""
    seqs, tokens, lengths, _ = fast_batch
    tokens_n, lengths_n = layers.encode_batch(seqs[::-1], buckets=(WIDTH,))
    zeros = ZEROS
    inside = np.arange(WIDTH)[None, :] < lengths_n[:, None]
    noisy = np.random.default_rng(4).normal(0.0, 5.0, size=zeros.shape)
    noisy[inside[:, :, None] & inside[:, None, :]] = 0.0  # noise on padding rows and columns only
    for name, run in (("log_partition", lambda t, n, f: layers.log_partition(turner64, t, n, phi=f)),
                      ("max_score", lambda t, n, f: layers.max_score(turner64, t, n)),
                      ("pair_probs", lambda t, n, f: layers.pair_probs(turner64, t, n, phi=f)),
                      ("best_structure", lambda t, n, f: layers.best_structure(turner64, t, n, phi=f))):
        a = np.asarray(run(tokens, lengths, zeros))
        b = np.asarray(run(tokens_n, lengths_n, noisy))[::-1]
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)


def test_free_energy_equals_vienna_eval(RNA, turner64):
    """Every loop type, every special hairpin, ViennaRNA's own samples, N letters, both ends
    paired or not (n <= 128, one batch); dot-brackets and pair tables give the same."""
    rng = random.Random(12)
    cases = constructed_cases(rng) + special_hairpin_cases(turner64)
    cases += pbacktrack_cases(RNA, rng, [rng.randint(1, 128) for _ in range(12)], 6)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 128)) for _ in range(20))]
    cases = [c for c in cases if len(c[0]) <= 128][:500]
    assert len(cases) == 500
    seqs, dbs = zip(*cases)
    tokens, lengths = padded(seqs, 128, seed=5)
    md = vienna_md(RNA)
    expected = np.array([RNA.fold_compound(vienna_rna_sequence(s), md).eval_structure_pt(RNA.ptable(db)) / 100
                         for s, db in cases])
    from_strings = np.asarray(layers.free_energy(turner64, tokens, list(dbs), lengths))
    np.testing.assert_allclose(from_strings, expected, rtol=0, atol=1e-9)
    tables = pair_tables([[(i, j) for i, j in enumerate(layers.from_dot_bracket(db)) if j > i] for db in dbs], 128)
    tables[np.arange(128)[None, :] >= lengths[:, None]] = 7  # garbage past the lengths is ignored
    np.testing.assert_array_equal(np.asarray(layers.free_energy(turner64, tokens, tables, lengths)), from_strings)


# --------------------------------------------------------------------------- #
# bad input
# --------------------------------------------------------------------------- #


def test_energy_only_functions_refuse_stacking_scores():
    stacking, x = layers.default_params(), layers.encode("GGGGAAACCCC")
    with pytest.raises(TypeError, match="free_energy needs Turner energy parameters"):
        layers.free_energy(stacking, x, "((((...))))")
    with pytest.raises(TypeError, match="ensemble_free_energy needs Turner energy parameters"):
        layers.ensemble_free_energy(stacking, x)


def test_malformed_turner_tables_are_named(turner64):
    x = layers.encode("GGGGAAACCCC")
    missing = {k: v for k, v in turner64.items() if k != "int22"}
    with pytest.raises((KeyError, ValueError), match="int22"):
        layers.log_partition(missing, x)
    bad_shape = {**turner64, "dangle5": jnp.zeros((6, 4))}
    with pytest.raises(ValueError, match="dangle5"):
        layers.max_score(bad_shape, x)
    with pytest.raises(ValueError, match="ml_closing"):
        layers.pair_probs({**turner64, "ml_closing": jnp.zeros(3)}, x)


def test_structures_outside_the_turner_grammar_are_refused(turner64):
    x = layers.encode("GGGGAAACCCA")
    with pytest.raises(StructureError, match=r"pair \(0, 10\) is G-A"):
        layers.structure_score(turner64, x, layers.from_dot_bracket("((((...))))"))
    with pytest.raises(ValueError, match="13 positions, but its sequence has 11"):
        layers.free_energy(turner64, x, "((((...))))..")


@pytest.fixture(scope="module")
def turner_par_lines(tmp_path_factory):
    """ViennaRNA's Turner 2004 written by foldax's own writer (read back by ViennaRNA in
    tests/test_energy_params.py), as lines."""
    path = tmp_path_factory.mktemp("par") / "turner.par"
    layers.save_parameter_file(layers.turner2004(jnp.float64), path)
    return path.read_text().splitlines()


def _sections(lines):
    """(name, header line index, last data line index) of each table section."""
    heads = [i for i, line in enumerate(lines) if line.startswith("# ")]
    out = []
    for h, nxt in zip(heads, heads[1:] + [len(lines)]):
        data = [i for i in range(h + 1, nxt) if lines[i].strip() and not lines[i].lstrip().startswith("/*")]
        if data:
            out.append((lines[h][2:].split()[0], h, data[-1]))
    return out


def section_name(header):
    """The name errors use: ``stack_enthalpies`` is read as a 'stack' table (the reader names
    the table it fills)."""
    return header.removesuffix("_enthalpies")


def test_every_truncated_section_names_file_and_line(turner_par_lines, tmp_path):
    """Each section cut before its last data line (the file continues with the next section):
    ``layers.load_parameter_file`` names the file, a line and the section."""
    sections = _sections(turner_par_lines)
    assert {"stack", "mismatch_hairpin", "dangle5", "int11", "int21", "int22", "hairpin", "ML_params", "NINIO",
            "Misc", "Tetraloops"} <= {s for s, _, _ in sections}
    for name, _, last in sections:
        if name in ("Triloops", "Tetraloops", "Hexaloops", "END"):
            continue  # special-loop lists have no fixed length (dropping an entry is legal)
        path = tmp_path / f"cut_{name}.par"
        path.write_text("\n".join(turner_par_lines[:last] + turner_par_lines[last + 1:]) + "\n")
        with pytest.raises(ValueError, match=rf"cut_{name}\.par line \d+: section '{section_name(name)}'"):
            layers.load_parameter_file(path)


def test_misshaped_rows_name_file_and_line(turner_par_lines, tmp_path):
    """A value dropped from (or added to) the first row of each table section: the error names
    the file, a line of that section and the section."""
    for name, header, last in _sections(turner_par_lines):
        if name in ("Triloops", "Tetraloops", "Hexaloops", "END"):
            continue
        first = next(i for i in range(header + 1, last + 1) if turner_par_lines[i].strip()
                     and not turner_par_lines[i].lstrip().startswith("/*"))
        row = turner_par_lines[first].split()
        for edit, tokens in (("short", row[:-1]), ("long", row + ["0"])):
            if name == "Misc" and edit == "short":
                continue  # 4 values are required, ViennaRNA writes a 5th (lxc), foldax a 6th
            lines = list(turner_par_lines)
            lines[first] = " ".join(tokens)
            path = tmp_path / f"{edit}_{name}.par"
            path.write_text("\n".join(lines) + "\n")
            with pytest.raises(ValueError, match=rf"{edit}_{name}\.par line \d+: section '{section_name(name)}'") as err:
                layers.load_parameter_file(path)
            line = int(str(err.value).split(" line ")[1].split(":")[0])
            assert header + 1 <= line <= last + 1, (name, edit, str(err.value))


def test_missing_and_empty_parameter_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.par"):
        layers.load_parameter_file(tmp_path / "nowhere.par")
    (tmp_path / "empty.par").write_text("")
    with pytest.raises(ValueError, match=r"empty\.par"):
        layers.load_parameter_file(tmp_path / "empty.par")



def test_dot_bracket_shorter_than_its_sequence_is_refused(turner64):
    """Never padded with unpaired positions: a dot-bracket must be exactly as long as its sequence."""
    with pytest.raises(ValueError, match="9 positions, but its sequence has 11"):
        layers.free_energy(turner64, layers.encode("GGGGAAACCCC"), "(((...)))")
    with pytest.raises(ValueError, match="13 positions, but its sequence has 11"):
        layers.free_energy(turner64, layers.encode("GGGGAAACCCC"), "((((...))))..")
    tokens, lengths = layers.encode_batch(["GGGGAAACCCC", "GGGAAACCC"])
    with pytest.raises(ValueError, match="structure 1 has 11 positions, but its sequence has 9"):
        layers.free_energy(turner64, tokens, ["((((...))))", "(((...)))..",], lengths)
    both = layers.free_energy(turner64, tokens, ["((((...))))", "(((...)))"], lengths)
    assert np.allclose(both, [float(layers.free_energy(turner64, layers.encode(s), d))
                              for s, d in [("GGGGAAACCCC", "((((...))))"), ("GGGAAACCC", "(((...)))")]])


def test_inside_layer_takes_turner_tables():
    layer = layers.InsideLayer(params=layers.turner2004())
    x = layers.encode("GGGGAAACCCC")
    assert layer.is_energy and float(layer(x)) == pytest.approx(float(layers.log_partition(layers.turner2004(), x)))


# --------------------------------------------------------------------------- #
# slow: energy sweep, brute force to n = 18, medium and long sequences
# --------------------------------------------------------------------------- #


@pytest.mark.slow
def test_free_energy_sweep_lengths_1_to_500(RNA):
    """>= 2,000 (sequence, structure) pairs: ViennaRNA's samples, random shapes with every loop
    type (also interior loops > 30, which eval extrapolates), constructed loops, special hairpins;
    float64 and float32, dot-brackets and pair tables, batched and one at a time."""
    rng = random.Random(2024)
    lengths = [1, 2, 3, 4, 5, 6, 500] + [rng.randint(1, 500) for _ in range(50)]
    cases = pbacktrack_cases(RNA, rng, lengths, 10)
    cases += [(fit_sequence(rng, db), db) for db in (random_shape(rng, rng.randint(1, 500)) for _ in range(700))]
    cases += constructed_cases(rng, per_kind=2) + special_hairpin_cases(layers.turner2004())
    assert len(cases) >= 2000
    seqs, dbs = zip(*cases)
    tokens, lengths = padded(seqs, 512, seed=6)
    md = vienna_md(RNA)
    expected = np.array([RNA.fold_compound(vienna_rna_sequence(s), md).eval_structure_pt(RNA.ptable(db)) / 100
                         for s, db in cases])
    params64 = layers.turner2004(jnp.float64)
    got = np.asarray(layers.free_energy(params64, tokens, list(dbs), lengths))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    tables = np.asarray(pair_tables([[(i, j) for i, j in enumerate(layers.from_dot_bracket(db)) if j > i]
                                     for db in dbs], 512))
    np.testing.assert_array_equal(np.asarray(layers.free_energy(params64, tokens, tables, lengths)), got)
    got32 = np.asarray(layers.free_energy(layers.turner2004(jnp.float32), tokens, tables, lengths), np.float64)
    np.testing.assert_allclose(got32, expected, rtol=1e-4, atol=1e-4)
    for b in rng.sample(range(len(cases)), 8):  # unbatched: [n] tokens with a scalar length
        assert float(layers.free_energy(params64, tokens[b], tables[b], lengths[b])) == pytest.approx(got[b], abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("with_phi", [False, True])
def test_log_partition_equals_brute_force_up_to_18(RNA, turner64, with_phi):
    rng = random.Random(18 + with_phi)
    seqs = [random_sequence(rng, n, "GGCCAU" if b % 3 else "ACGUN") for b, n in enumerate((15, 15, 16, 16, 17, 17,
                                                                                            18, 18))]
    tokens, lengths = padded(seqs, WIDTH, seed=7)
    phi = np.random.default_rng(8).normal(0.0, 1.0, size=(BATCH, WIDTH, WIDTH)) if with_phi else ZEROS
    got = np.asarray(layers.log_partition(turner64, tokens, lengths, phi=phi))
    total = 0
    for b, seq in enumerate(seqs):
        structures, weights = vienna_structure_weights(RNA, seq, phi=phi[b])
        total += len(structures)
        assert got[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), seq
    assert total > 3_000


@pytest.fixture(scope="module")
def medium_batch(RNA):
    """8 sequences of 49..96 nt (several diagonal chunks at width 96), half GC-rich, some N, one
    with a hairpin of 45; ViennaRNA's results without and with soft constraints."""
    rng = random.Random(96)
    seqs = [random_sequence(rng, n, "ACGUN" if b % 3 == 0 else "GGCCAU" if b % 2 else "ACGU")
            for b, n in enumerate((49, 60, 71, 80, 88, 93, 96))]
    seqs.append("GGGCGC" + random_sequence(rng, 45, "AC") + "GCGCCC" + random_sequence(rng, 20))
    tokens, lengths = padded(seqs, MEDIUM, seed=9)
    soft, phis = zip(*(soft_constraints(rng, seq, MEDIUM, rate=0.05) for seq in seqs))
    return seqs, tokens, lengths, vienna_results(RNA, seqs), np.stack(phis), vienna_results(RNA, seqs, soft)


@pytest.mark.slow
def test_medium_lengths_pf_mfe_bpp_phi(medium_batch):
    seqs, tokens, lengths, vienna, phi, vienna_sc = medium_batch
    params64, params32 = layers.turner2004(jnp.float64), layers.turner2004(jnp.float32)
    assert_ensemble_energies(layers.ensemble_free_energy(params64, tokens, lengths), [v[0] for v in vienna], 1e-6)
    assert_ensemble_energies(layers.ensemble_free_energy(params32, tokens, lengths), [v[0] for v in vienna], 1e-4)
    zeros = np.zeros_like(phi)
    for f, results in ((zeros, vienna), (phi, vienna_sc)):
        mfe = -KT * np.asarray(layers.max_score(params64, tokens, lengths, phi=f))
        np.testing.assert_allclose(mfe, [v[1] for v in results], rtol=0, atol=1e-4)
        best = np.asarray(layers.best_structure(params64, tokens, lengths, phi=f))
        bonus = [sum(f[b, i, j] for i, j in enumerate(best[b]) if j > i) for b in range(len(seqs))]
        energy = np.asarray(layers.free_energy(params64, tokens, best, lengths)) - KT * np.asarray(bonus)
        np.testing.assert_allclose(energy, [v[1] for v in results], rtol=0, atol=1e-4)
        assert_pair_probs(layers.pair_probs(params64, tokens, lengths, phi=f), [v[3] for v in results], lengths, 1e-6)
        assert_pair_probs(layers.pair_probs(params32, tokens, lengths, phi=f), [v[3] for v in results], lengths, 1e-3)
        # structure_score gives the partition function's energy: equal to the MFE's unless the
        # structure has a hairpin > 30 (untruncated there)
        score = np.asarray(layers.structure_score(params64, tokens, best, lengths, phi=f))
        long_hairpin = np.array(["." * 31 in layers.to_dot_bracket(t) for t in best])
        np.testing.assert_allclose(score[~long_hairpin], -mfe[~long_hairpin] / KT, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(score[long_hairpin], -mfe[long_hairpin] / KT, rtol=0, atol=0.01 / KT)
    assert "(" + "." * 45 + ")" in vienna[-1][2]  # a hairpin > 30 in the MFE structure


@pytest.mark.slow
def test_two_thousand_nucleotides(RNA):
    """n = 2,000: ViennaRNA's pf (Boltzmann factors rescaled from the MFE) and MFE."""
    rng = random.Random(2000)
    seq = random_sequence(rng, 1990) + "NNRYACGUAC"
    fc, _, mfe = vienna_fold_compound(RNA, seq)
    expected = vienna_pf_result(fc)
    tokens, lengths = padded([seq], LONG, seed=10)
    for dtype, rel in ((jnp.float64, 1e-6), (jnp.float32, 1e-4)):
        got = layers.ensemble_free_energy(layers.turner2004(dtype), tokens, lengths)
        assert_ensemble_energies(got, [expected], rel, context=dtype.__name__)
    got_mfe = -KT * float(layers.max_score(layers.turner2004(jnp.float64), tokens, lengths)[0])
    assert got_mfe == pytest.approx(mfe, abs=1e-4)


# --------------------------------------------------------------------------- #
# slow: derivatives
# --------------------------------------------------------------------------- #


def gradient_sequences(params):
    """8 sequences of <= WIDTH nt that use every table: special tri-, tetra- and hexaloops, a
    hairpin > 30 (lxc), GC-rich multiloops, N letters, stems at both ends."""
    rng = random.Random(4242)
    return [
        special_hairpin_sequence(params, 5) + "A" + special_hairpin_sequence(params, 6)
        + special_hairpin_sequence(params, 8),
        "GGGGCC" + "A" * 34 + "GGCCCC",
        random_sequence(rng, 48, "GGCCAU"),
        random_sequence(rng, 44, "GGCCAUN"),
        random_sequence(rng, 40, "GCAU"),
        random_sequence(rng, 36, "GGGCCCAUUA"),
        random_sequence(rng, 30, "ACGU"),
        random_sequence(rng, 47, "GGCCU"),
    ]


def weighted_log_partition(params, tokens, lengths, weights):
    phi = jnp.zeros(tokens.shape + tokens.shape[-1:], weights.dtype)  # the fast tests' program
    return jnp.sum(weights * layers.log_partition(params, tokens, lengths, phi=phi))


grad_log_partition = jax.grad(weighted_log_partition)


@pytest.mark.slow
def test_gradients_equal_finite_differences(turner64):
    """d/dt f(params + t v) by jax.grad and by central differences, for a random direction v in
    each table (every one, special hairpins and scalars included), f = SUM_b w_b log Z_b."""
    params = perturbed(turner64, 1, std=0.5)
    tokens, lengths = padded(gradient_sequences(turner64), WIDTH, seed=11)
    weights = jnp.asarray(np.random.default_rng(12).normal(size=BATCH))
    grad = grad_log_partition(params, tokens, lengths, weights)
    assert_all_finite(grad)
    rng, eps = np.random.default_rng(13), 1e-4
    for key in table_keys(params):
        v = direction(params, key, rng)
        analytic = tree_vdot(grad, v)
        plus, minus = (float(weighted_log_partition(shifted(params, v, s * eps), tokens, lengths, weights))
                       for s in (1, -1))
        numeric = (plus - minus) / (2 * eps)
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-7), key
        assert abs(numeric) > 1e-4, f"{key}: the batch does not exercise this table"


@pytest.mark.slow
def test_gradients_are_expected_feature_counts(turner64):
    """d log Z / d theta = -E_p[dE(s)/d theta] / kT, the expectation over every structure s with
    p(s) = exp(-E(s)/kT) / Z (E and dE/d theta from layers.free_energy), for every table."""
    params = perturbed(turner64, 2, std=0.3)
    rng = random.Random(14)
    seqs = [special_hairpin_sequence(turner64, size) for size in (5, 6, 8)]
    seqs += [random_sequence(rng, n, "GGCCAUN") for n in (10, 11, 12, 12, 13)]
    tokens, lengths = padded(seqs, WIDTH, seed=15)
    weights = np.random.default_rng(16).normal(size=BATCH)
    rows, row_weights, structure_tables = [], [], []
    for b, seq in enumerate(seqs):
        structures = list(enumerate_turner_structures(seq))
        tables = pair_tables(structures, WIDTH)
        energy = np.asarray(layers.free_energy(params, np.repeat(tokens[b : b + 1], len(structures), 0), tables,
                                               np.full(len(structures), len(seq))))
        log_z = logsumexp(-energy / KT)
        assert float(layers.log_partition(params, tokens, lengths)[b]) == pytest.approx(log_z, rel=1e-10)
        rows += [b] * len(structures)
        row_weights.append(weights[b] * np.exp(-energy / KT - log_z))
        structure_tables.append(tables)
    row_weights, structure_tables = np.concatenate(row_weights), np.concatenate(structure_tables)
    row_tokens, row_lengths = tokens[rows], lengths[rows]

    def expected_energy(p):  # SUM_b w_b E_p[E(s)], p held fixed
        return jnp.sum(row_weights * layers.free_energy(p, row_tokens, structure_tables, row_lengths))

    expected = jax.tree.map(lambda g: -g / KT, jax.grad(expected_energy)(params))
    got = grad_log_partition(params, tokens, lengths, jnp.asarray(weights))
    for key in table_keys(params):
        for (path, g), e in zip(jax.tree_util.tree_leaves_with_path(got[key]), jax.tree.leaves(expected[key])):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-9, atol=1e-11,
                                       err_msg=key + jax.tree_util.keystr(path))
    assert sum(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(got["special_hairpins"])) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_no_nan_or_inf_for_large_parameters(turner64, dtype):
    """Tables x10 and random perturbations of std 2 kcal/mol: finite log Z, gradients (float64
    and float32) and pair probabilities in [0, 1]."""
    tokens, lengths = padded(gradient_sequences(turner64), WIDTH, seed=17)
    weights = jnp.ones(BATCH, dtype)
    base = jax.tree.map(lambda a: a.astype(dtype), turner64)
    for name, params in (("x10", perturbed(base, 3, std=0.0, scale=10.0)), ("std 2", perturbed(base, 4, std=2.0))):
        log_z = layers.log_partition(params, tokens, lengths)
        assert log_z.dtype == dtype and np.isfinite(np.asarray(log_z)).all(), name
        assert_all_finite(grad_log_partition(params, tokens, lengths, weights), name)
        if dtype == jnp.float64:
            probs = np.asarray(layers.pair_probs(params, tokens, lengths, phi=ZEROS))
            assert np.isfinite(probs).all() and probs.min() >= 0 and probs.sum(axis=2).max() <= 1 + 1e-9, name


@pytest.mark.slow
def test_log_prob_gradients(RNA, turner64):
    """log_prob = structure_score - log Z: equals ViennaRNA's -E(s)/kT - ln Q; its gradient
    w.r.t. phi is 1[(i,j) in s] - P[i, j], and w.r.t. every table it equals finite differences."""
    seqs = gradient_sequences(turner64)
    tokens, lengths = padded(seqs, WIDTH, seed=18)
    tables = pair_tables([[(i, j) for i, j in enumerate(layers.from_dot_bracket(v[2])) if j > i]
                          for v in vienna_results(RNA, seqs)], WIDTH)
    phi = np.random.default_rng(19).normal(0.0, 0.5, size=(BATCH, WIDTH, WIDTH))
    weights = jnp.asarray(np.random.default_rng(20).normal(size=BATCH))

    def objective(p, f):
        return jnp.sum(weights * layers.log_prob(p, tokens, tables, lengths, phi=f))

    # values: ViennaRNA's energy of each structure and its ensemble (phi = 0)
    log_p = np.asarray(layers.log_prob(turner64, tokens, tables, lengths, phi=np.zeros_like(phi)))
    md = vienna_md(RNA)
    for b, seq in enumerate(seqs):
        fc, _, _ = vienna_fold_compound(RNA, seq)
        energy = RNA.fold_compound(vienna_rna_sequence(seq), md).eval_structure_pt(RNA.ptable(
            layers.to_dot_bracket(tables[b, : len(seq)]))) / 100
        if "." * 31 not in layers.to_dot_bracket(tables[b, : len(seq)]):  # no hairpin > 30: eval = pf energy
            assert log_p[b] == pytest.approx((vienna_pf_result(fc) - energy) / KT, rel=1e-9, abs=1e-9), seq
    params = perturbed(turner64, 5, std=0.5)
    grad_params, grad_phi = jax.grad(objective, argnums=(0, 1))(params, phi)
    assert_all_finite((grad_params, grad_phi))
    indicator = np.zeros_like(phi)
    for b in range(BATCH):
        for i, j in enumerate(tables[b]):
            if j > i:
                indicator[b, i, j] = 1.0
    probs = np.triu(np.asarray(layers.pair_probs(params, tokens, lengths, phi=phi)), 1)
    np.testing.assert_allclose(np.triu(np.asarray(grad_phi), 1), np.asarray(weights)[:, None, None] * (indicator - probs),
                               rtol=1e-9, atol=1e-11)
    rng, eps = np.random.default_rng(21), 1e-4
    for key in table_keys(params):
        v = direction(params, key, rng)
        numeric = (float(objective(shifted(params, v, eps), phi)) - float(objective(shifted(params, v, -eps), phi))) / (
            2 * eps)
        assert tree_vdot(grad_params, v) == pytest.approx(numeric, rel=1e-6, abs=1e-7), key


@pytest.mark.slow
def test_gradient_of_a_function_of_pair_probs(turner64):
    """jax.grad of SUM M * pair_probs (w.r.t. the scalar energies: second derivatives of log Z)
    against central differences of pair_probs."""
    tokens, lengths = padded(gradient_sequences(turner64), WIDTH, seed=22)
    base = perturbed(turner64, 6, std=0.3)
    mask = np.random.default_rng(23).normal(size=ZEROS.shape)
    scalars = {k: base[k] for k in ("ml_closing", "ml_intern", "ml_base", "terminal_au", "ninio")}

    def probs_objective(s):
        return jnp.sum(mask * layers.pair_probs({**base, **s}, tokens, lengths, phi=ZEROS))

    grad = jax.grad(probs_objective)(scalars)
    eps = 1e-4
    for key in scalars:
        up = float(probs_objective({**scalars, key: scalars[key] + eps}))
        down = float(probs_objective({**scalars, key: scalars[key] - eps}))
        assert float(grad[key]) == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-7), key
        assert abs(float(grad[key])) > 1e-3, key


@pytest.mark.slow
def test_hessian_of_log_partition(turner64):
    """jax.hessian of log Z w.r.t. the stack table: symmetric, and H v equals central
    differences of the gradient along random v."""
    tokens, lengths = padded(gradient_sequences(turner64), WIDTH, seed=24)
    base = perturbed(turner64, 7, std=0.3)
    weights = jnp.asarray(np.random.default_rng(25).normal(size=BATCH))

    def stack_objective(stack):
        return weighted_log_partition({**base, "stack": stack}, tokens, lengths, weights)

    hessian = np.asarray(jax.hessian(stack_objective)(base["stack"])).reshape(36, 36)
    assert np.isfinite(hessian).all()
    np.testing.assert_allclose(hessian, hessian.T, rtol=1e-9, atol=1e-10)
    rng, eps = np.random.default_rng(26), 1e-4
    for _ in range(3):
        v = rng.normal(size=(6, 6))
        up, down = (np.asarray(grad_log_partition({**base, "stack": base["stack"] + s * eps * v}, tokens, lengths,
                                                  weights)["stack"]) for s in (1, -1))
        np.testing.assert_allclose(hessian @ v.ravel(), ((up - down) / (2 * eps)).ravel(), rtol=1e-5, atol=1e-6)
    assert np.abs(hessian).max() > 1e-2


@pytest.mark.slow
def test_mea_structure_of_turner_pair_probs(RNA, fast_batch, turner64):
    """mea_structure maximises the expected accuracy SUM 2 gamma P[i,j] + SUM_unpaired q_i, so
    it scores at least as high as ViennaRNA's MEA structure (fc.MEA) under the same probabilities."""
    seqs, tokens, lengths, _ = fast_batch
    probs = np.asarray(layers.pair_probs(turner64, tokens, lengths, phi=ZEROS))

    def accuracy(p, table, gamma):
        unpaired = 1 - p.sum(axis=1)
        return sum(2 * gamma * p[i, j] if j > i else unpaired[i] if j < 0 else 0.0 for i, j in enumerate(table))

    for gamma in (1.0, 4.0):
        mea = np.asarray(layers.mea_structure(probs, lengths, gamma=gamma))
        for b, seq in enumerate(seqs[1:], start=1):
            n = len(seq)
            fc, _, _ = vienna_fold_compound(RNA, seq)
            theirs = layers.from_dot_bracket(fc.MEA(gamma)[0])
            p = probs[b, :n, :n]
            assert accuracy(p, mea[b, :n], gamma) >= accuracy(p, theirs, gamma) - 1e-4, (seq, gamma)


# --------------------------------------------------------------------------- #
# slow: sampling, vmap, other parameter sets
# --------------------------------------------------------------------------- #


def chi_square_p_value(counts, expected, min_expected=5.0):
    """Pearson's test of counts against expected counts, pooling bins expected below min_expected."""
    small = expected < min_expected
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    return float(chi2.sf(statistic, len(observed) - 1)), len(observed)


def sample_fit(samples, n, structures, weights):
    """(p-value, bins) of one sequence's samples (rows of pair tables) against the Boltzmann
    distribution of log-weights over every structure; asserts no sample lies outside them."""
    index = {s: k for k, s in enumerate(structures)}
    counts = collections.Counter(tuple((i, int(j)) for i, j in enumerate(t[:n]) if j > i) for t in samples)
    assert set(counts) <= set(index), "a sample outside the folding space"
    observed = np.zeros(len(structures))
    for s, c in counts.items():
        observed[index[s]] = c
    return chi_square_p_value(observed, len(samples) * np.exp(weights - logsumexp(weights)))


@pytest.mark.slow
def test_samples_follow_the_boltzmann_distribution(RNA):
    """4,000 samples per sequence (float32, random phi) against exact probabilities over every
    structure. The energies are Turner 2004 scaled by 0.3 (a flatter ensemble: more bins), i.e.
    0.3 x ViennaRNA's eval, since E(s) is linear in the tables."""
    rng = random.Random(26)
    seqs = [random_sequence(rng, 15, "GCAU"), random_sequence(rng, 16, "GCAU")]
    width, num, scale = 16, 4000, 0.3
    tokens, lengths = padded(seqs, width, seed=27)
    phi = np.random.default_rng(28).normal(0.0, 0.5, size=(len(seqs), width, width)).astype(np.float32)
    params = perturbed(layers.turner2004(jnp.float32), 0, std=0.0, scale=scale)
    samples = np.asarray(layers.sample_structures(jax.random.key(0), params, tokens, num, lengths, phi=phi))
    assert samples.shape == (len(seqs), num, width) and samples.dtype == np.int32
    for b, seq in enumerate(seqs):
        n = len(seq)
        assert (samples[b, :, n:] == -1).all()
        structures, weights = vienna_structure_weights(RNA, seq)
        weights = scale * weights + np.array([sum(float(phi[b, i, j]) for i, j in s) for s in structures])
        p_value, bins = sample_fit(samples[b], n, structures, weights)
        assert bins >= 50 and p_value > 1e-3, (seq, p_value, bins)


@pytest.mark.slow
def test_vmap_and_single_calls_equal_the_batch(fast_batch, turner64):
    """jax.vmap with per-example lengths, and one call per sequence (padded with a scalar length,
    or exactly its length), equal the batched call."""
    seqs, tokens, lengths, _ = fast_batch
    zeros = ZEROS
    batched = {"log_partition": layers.log_partition(turner64, tokens, lengths, phi=ZEROS),
               "max_score": layers.max_score(turner64, tokens, lengths),
               "pair_probs": layers.pair_probs(turner64, tokens, lengths, phi=zeros)}
    vmapped = {
        "log_partition": jax.vmap(lambda t, n: layers.log_partition(turner64, t, n))(tokens, lengths),
        "max_score": jax.vmap(lambda t, n: layers.max_score(turner64, t, n))(tokens, lengths),
        "pair_probs": jax.vmap(lambda t, n, f: layers.pair_probs(turner64, t, n, phi=f))(tokens, lengths, zeros),
    }
    for name in batched:
        np.testing.assert_allclose(np.asarray(vmapped[name]), np.asarray(batched[name]), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
    single = [float(layers.log_partition(turner64, tokens[b], lengths[b])) for b in range(BATCH)]
    np.testing.assert_allclose(single, np.asarray(batched["log_partition"]), rtol=1e-12, atol=1e-12)
    full = int(np.argmax(lengths == WIDTH))  # exact length: the same [WIDTH] program
    assert float(layers.log_partition(turner64, layers.encode(seqs[full]))) == pytest.approx(single[full], rel=1e-12)


@pytest.fixture(scope="module")
def vienna_sets(RNA, tmp_path_factory):
    return save_vienna_parameter_sets(RNA, tmp_path_factory.mktemp("par"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Andronescu2007", "Langdon2018", "Turner1999"])
def test_other_parameter_sets_equal_vienna(RNA, vienna_sets, name):
    """A .par file from RNA.params_save, read by layers.load_parameter_file: ViennaRNA's pf, MFE,
    pair probabilities and brute-force sums (Langdon 2018 forbids some loops with INF)."""
    params = layers.load_parameter_file(vienna_sets[name], dtype=jnp.float64)
    RNA.params_load(str(vienna_sets[name]))
    try:
        seqs = fast_sequences(params)
        tokens, lengths = padded(seqs, WIDTH, seed=30)
        vienna = vienna_results(RNA, seqs)
        assert_ensemble_energies(layers.ensemble_free_energy(params, tokens, lengths), [v[0] for v in vienna], 1e-6)
        mfe = -KT * np.asarray(layers.max_score(params, tokens, lengths))
        np.testing.assert_allclose(mfe, [v[1] for v in vienna], rtol=0, atol=1e-4)
        assert_pair_probs(layers.pair_probs(params, tokens, lengths, phi=ZEROS),
                          [v[3] for v in vienna], lengths, 1e-6)
        rng = random.Random(31)
        short = [random_sequence(rng, n, "GGCCAU" if n % 2 else "ACGUN") for n in range(9, 17)]
        tokens, lengths = padded(short, WIDTH, seed=32)
        got = np.asarray(layers.log_partition(params, tokens, lengths))
        assert float(params["ninio"]) <= float(params["max_ninio"])  # eval = pf for 2x3 loops
        for b, seq in enumerate(short):
            _, weights = vienna_structure_weights(RNA, seq)
            assert got[b] == pytest.approx(logsumexp(weights), rel=1e-10, abs=1e-10), (name, seq)
    finally:
        RNA.params_load_RNA_Turner2004()
