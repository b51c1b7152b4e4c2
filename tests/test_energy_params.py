"""Turner 2004 parameters (layers/energy_params.py): packaged data, .par reader and writer.

ViennaRNA is the oracle: its parameter arrays (``RNA.param``, where the SWIG wrapper exposes
them), its own reader (``RNA.params_load``) and writer (``RNA.params_save``). Energies of whole
structures under loaded parameter files are checked in tests/test_energy_reference.py.
"""

from __future__ import annotations

import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from foldax.layers import energy_params as ep
from foldax.layers.energy_params import (
    CLIPPED_TABLES,
    KT,
    PAIR_INDEX,
    PAIR_TYPES,
    SCALAR_NAMES,
    TABLE_SHAPES,
    check_energy_params,
    load_parameter_file,
    parameters_from_string,
    parameters_to_string,
    save_parameter_file,
    turner2004,
)

jax.config.update("jax_enable_x64", True)

V_BASE = [1, 2, 3, 4, 0]  # ViennaRNA base index of foldax token 0..4
HEADER = "## RNAfold parameter file v2.0\n"


@pytest.fixture
def RNA():
    module = pytest.importorskip("RNA")
    module.params_load_RNA_Turner2004()
    yield module
    module.params_load_RNA_Turner2004()


@pytest.fixture(scope="module")
def saved_sets(tmp_path_factory):
    """ViennaRNA's Turner 2004, Andronescu 2007 and Langdon 2018 written by RNA.params_save."""
    module = pytest.importorskip("RNA")
    folder = tmp_path_factory.mktemp("par")
    files = {}
    for name in ("Turner2004", "Andronescu2007", "Langdon2018"):
        getattr(module, f"params_load_RNA_{name}")()
        files[name] = folder / f"rna_{name.lower()}.par"
        assert module.params_save(str(files[name]))
    module.params_load_RNA_Turner2004()
    return files


def as_np(params) -> dict:
    out = {k: np.asarray(v, dtype=np.float64) for k, v in params.items() if k != "special_hairpins"}
    out["special_hairpins"] = {k: float(v) for k, v in params["special_hairpins"].items()}
    return out


def assert_params_equal(a, b):
    a, b = as_np(a), as_np(b)
    for key in list(TABLE_SHAPES) + list(SCALAR_NAMES):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert a["special_hairpins"] == b["special_hairpins"]


def vienna_arrays(RNA) -> dict:
    """The tables the SWIG wrapper exposes, in foldax layout and kcal/mol."""
    P = RNA.param(RNA.md())

    def inf(a):
        return np.where(np.asarray(a) >= 10000000, np.inf, np.asarray(a) / 100)

    special = {}
    for names, energies in ((P.Triloops, P.Triloop_E), (P.Tetraloops, P.Tetraloop_E), (P.Hexaloops, P.Hexaloop_E)):
        for index, seq in enumerate(names.split()):
            special[seq] = energies[index] / 100
    return {
        "stack": inf(np.asarray(P.stack)[1:7, 1:7]),
        "hairpin": inf(P.hairpin),
        "bulge": inf(P.bulge),
        "interior": inf(P.internal_loop),
        "dangle5": inf(np.asarray(P.dangle5)[1:7][:, V_BASE]),
        "dangle3": inf(np.asarray(P.dangle3)[1:7][:, V_BASE]),
        "ninio": P.ninio[2] / 100,
        "ml_intern": P.MLintern[1] / 100,
        "ml_base": P.MLbase / 100,
        "ml_closing": P.MLclosing / 100,
        "terminal_au": P.TerminalAU / 100,
        "lxc": P.lxc / 100,
        "special_hairpins": special,
    }


def assert_matches_vienna(params, RNA, *, lxc=True):
    params = as_np(params)
    for key, expected in vienna_arrays(RNA).items():
        if key == "lxc" and not lxc:
            continue
        if key == "special_hairpins":
            assert params[key] == pytest.approx(expected, abs=1e-12), key
        else:
            np.testing.assert_allclose(params[key], expected, rtol=0, atol=1e-12, err_msg=key)


# --------------------------------------------------------------------------- #
# layout and the packaged Turner 2004 set
# --------------------------------------------------------------------------- #


def test_layout_shapes_dtypes_and_inf_entries():
    params = turner2004()
    check_energy_params(params)
    assert set(params) == set(TABLE_SHAPES) | set(SCALAR_NAMES) | {"special_hairpins"}
    assert all(v.dtype == jnp.float32 for k, v in params.items() if k != "special_hairpins")
    p64 = as_np(turner2004(jnp.float64))
    assert turner2004(jnp.float64)["stack"].dtype == jnp.float64
    for key in list(TABLE_SHAPES) + list(SCALAR_NAMES):
        assert not np.isnan(p64[key]).any(), key
        infinite = np.argwhere(np.isinf(p64[key])).ravel().tolist()
        expected = {"hairpin": [0, 1, 2], "bulge": [0], "interior": [0, 1]}.get(key, [])
        assert infinite == expected, key
        assert (p64[key] != -np.inf).all()
    assert sorted(map(len, p64["special_hairpins"])) == [5] * 2 + [6] * 16 + [8] * 4
    assert p64["lxc"] == 1.07856 and p64["max_ninio"] == 3.0
    assert KT == pytest.approx(0.61632077549999997, abs=1e-15)


def test_pair_index():
    tokens = "ACGUN"
    for x in range(5):
        for y in range(5):
            name = tokens[x] + tokens[y]
            assert PAIR_INDEX[x, y] == (PAIR_TYPES.index(name) if name in PAIR_TYPES else -1)
    assert PAIR_TYPES == ("CG", "GC", "GU", "UG", "AU", "UA")


def test_turner2004_equals_vienna(RNA):
    assert_matches_vienna(turner2004(jnp.float64), RNA)


def test_packaged_data_is_a_fresh_conversion_with_provenance(RNA):
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "convert_vienna_params.py"
    spec = importlib.util.spec_from_file_location("convert_vienna_params", script)
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    fresh = convert.convert()
    packaged = json.loads((pathlib.Path(ep.__file__).parent / "data" / "rna_turner2004.json").read_text())
    for key in ("tables", "scalars", "special_hairpins", "enthalpies"):
        assert packaged[key] == fresh[key], key
    provenance = packaged["provenance"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", provenance["viennarna_version"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", provenance["date"])
    assert any("Mathews" in c and "2004" in c for c in provenance["citations"])
    assert any("Turner" in c and "NNDB" in c for c in provenance["citations"])
    assert any("ViennaRNA Package 2.0" in c for c in provenance["citations"])


def test_int22_n_entries_follow_vienna_rule():
    """Entries with N are the maximum over ACGU in those positions (ViennaRNA's update_nst)."""
    int22 = np.asarray(turner2004(jnp.float64)["int22"])
    acgu = int22[..., :4, :4, :4, :4]
    np.testing.assert_array_equal(int22[..., 4, :4, :4, :4], acgu.max(axis=2))
    np.testing.assert_array_equal(int22[..., :4, :4, :4, 4], acgu.max(axis=5))
    np.testing.assert_array_equal(int22[..., 4, 4, 4, 4], acgu.max(axis=(2, 3, 4, 5)))


# --------------------------------------------------------------------------- #
# reading ViennaRNA's files
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ["Turner2004", "Andronescu2007", "Langdon2018"])
def test_load_vienna_sets_equals_vienna_arrays(RNA, saved_sets, name):
    params = load_parameter_file(saved_sets[name], dtype=jnp.float64)
    getattr(RNA, f"params_load_RNA_{name}")()
    assert_matches_vienna(params, RNA)
    if name == "Turner2004":
        assert_params_equal(params, turner2004(jnp.float64))


def test_langdon_positive_dangles_are_clipped(saved_sets):
    text = saved_sets["Langdon2018"].read_text()
    assert re.search(r"# mismatch_exterior\n(.*\n)*?\s+[1-9]\d*\s", text)  # the file has positives
    params = as_np(load_parameter_file(saved_sets["Langdon2018"], dtype=jnp.float64))
    for key in CLIPPED_TABLES:
        assert (params[key] <= 0).all(), key


def test_missing_sections_keep_turner_values_like_vienna(RNA, tmp_path):
    """A partial file changes only what it lists; ViennaRNA (with Turner 2004 loaded) agrees."""
    path = tmp_path / "partial.par"
    path.write_text(
        HEADER
        + "# ML_params\n 10 0 800 0 -50 0\n\n# Tetraloops\nGAAAAC 100 0\nCUUCGG 200 0\n\n"
        + "# hairpin\n INF INF INF 500 x x 610 * DEF NST\n x x x x x x x x x x\n x x x x x x x x x x\n x\n"
    )
    params = load_parameter_file(path, dtype=jnp.float64)
    RNA.params_load(str(path))
    assert_matches_vienna(params, RNA)
    p, t = as_np(params), as_np(turner2004(jnp.float64))
    assert (p["ml_base"], p["ml_closing"], p["ml_intern"]) == (0.1, 8.0, -0.5)
    assert p["hairpin"][7] == t["hairpin"][7] != p["hairpin"][6]  # '*' keeps the current value
    assert (p["hairpin"][8], p["hairpin"][9]) == (-0.5, 0.0)  # DEF, NST
    assert p["hairpin"][10] == pytest.approx((610 + round(107.856 * np.log(10 / 6))) / 100, abs=1e-12)  # x
    assert {k for k in p["special_hairpins"] if len(k) == 6} == {"GAAAAC", "CUUCGG"}
    assert {k for k in p["special_hairpins"] if len(k) != 6} == {k for k in t["special_hairpins"] if len(k) != 6}
    np.testing.assert_array_equal(p["int22"], t["int22"])


def test_base_parameters_and_empty_special_list(tmp_path):
    base = as_np(turner2004(jnp.float64))
    base["ninio"] = np.float64(0.75)
    path = tmp_path / "x.par"
    path.write_text(HEADER + "# Triloops\n\n# Misc\n 410 360 70 370 100.5 0\n")
    params = as_np(load_parameter_file(path, base=base, dtype=jnp.float64))
    assert params["ninio"] == 0.75  # from base
    assert not any(len(k) == 5 for k in params["special_hairpins"])  # an empty list erases
    assert params["terminal_au"] == 0.7 and params["lxc"] == 1.005  # lxc read from Misc
    path.write_text(HEADER + "# Misc\n 410 360 70 370\n")
    assert as_np(load_parameter_file(path, dtype=jnp.float64))["lxc"] == 1.07856


def test_deprecated_names_unknown_sections_and_comments(tmp_path):
    path = tmp_path / "old.par"
    path.write_text(
        HEADER + "free text before the first section /* even an unclosed comment\n"
        "# interior /* deprecated name */\n" + "\n".join(["100 /* a */ 100 /* b */ 100"] + ["x"] * 28) + "\n"
        "# mystery\n 1 2 3\n#END\n"
    )
    with pytest.warns(UserWarning, match="unknown section 'mystery'"):
        params = as_np(load_parameter_file(path, dtype=jnp.float64))
    assert params["interior"][2] == 1.0 and params["interior"][3] > 1.0


def test_deprecated_mismatch_name(tmp_path):
    text = parameters_to_string(turner2004(jnp.float64)).replace("# mismatch_internal\n", "# mismatch_interior\n")
    assert_params_equal(parameters_from_string(text, dtype=jnp.float64), turner2004(jnp.float64))


# --------------------------------------------------------------------------- #
# bad files
# --------------------------------------------------------------------------- #


def _saved_lines(saved_sets):
    return saved_sets["Turner2004"].read_text().splitlines()


def _line_of(lines, header):
    return lines.index(header) + 1  # 1-based


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda L: ["## RNAfold parameter file"] + L[1:], r"x\.par line 1: not a ViennaRNA 2\.0 parameter file"),
        (
            lambda L: L[:4] + ["  -240  -330  -210  -140  -210"] + L[5:],
            r"x\.par line 5: section 'stack' expects 7 values per row, got 5",
        ),
        (lambda L: L[:4] + [L[4] + "  -10"] + L[5:], r"x\.par line 5: section 'stack' expects 7 values per row, got 8"),
        (
            lambda L: L[:5] + [L[5].replace("-330", "-3.3")] + L[6:],
            r"x\.par line 6: section 'stack': cannot read value '-3\.3'",
        ),
        (
            lambda L: L[:6] + [L[6].replace("130", "-1i40", 1)] + L[7:],
            r"x\.par line 7: section 'stack': cannot read value '-1i40'",
        ),
        (lambda L: L[:4] + [L[4] + " /* open"] + L[5:], r"x\.par line 5: unclosed comment"),
        (lambda L: L[:10] + [L[10], L[10]] + L[11:], r"x\.par line 12: section 'stack' has more than 7 rows"),
        (lambda L: L[:9] + L[11:], r"x\.par line 9: section 'stack' ends after 5 of 7 rows"),
        (lambda L: L + ["# stack"] + L[3:11], r"section 'stack' appears twice \(first at line 3\)"),
        (lambda L: L[:4] + [L[4].replace("-240", "x")] + L[5:], r"'x' \(extrapolation\) is only allowed"),
    ],
)
def test_malformed_files_name_file_and_line(saved_sets, tmp_path, edit, message):
    path = tmp_path / "x.par"
    path.write_text("\n".join(edit(_saved_lines(saved_sets))) + "\n")
    with pytest.raises(ValueError, match=message):
        load_parameter_file(path)


def test_truncated_files(saved_sets, tmp_path):
    lines = _saved_lines(saved_sets)
    path = tmp_path / "cut.par"
    start = _line_of(lines, "# int21")
    path.write_text("\n".join(lines[: start + 100]) + "\n")  # 100 lines into int21
    with pytest.raises(
        ValueError, match=rf"cut\.par line {start + 100}: section 'int21' ends after 83 of 1225 rows \(5 values each\)"
    ):
        load_parameter_file(path)
    start = _line_of(lines, "# hairpin")
    path.write_text("\n".join(lines[: start + 2]) + "\n")
    with pytest.raises(ValueError, match=rf"cut\.par line {start + 2}: section 'hairpin' expects 31 values, got 20"):
        load_parameter_file(path)
    start = _line_of(lines, "# ML_params")
    path.write_text("\n".join(lines[:start] + ["  0 0 930 3000 -90"]) + "\n")
    with pytest.raises(ValueError, match=rf"cut\.par line {start + 1}: section 'ML_params' expects 6 values, got 5"):
        load_parameter_file(path)
    path.write_text("")
    with pytest.raises(ValueError, match=r"cut\.par line 1: not a ViennaRNA"):
        load_parameter_file(path)


@pytest.mark.parametrize(
    "body, message",
    [
        ("# Tetraloops\nCAACG 550 690\n", r"line 3: section 'Tetraloops': 'CAACG' is not 6 letters"),
        (
            "# Tetraloops\nCAACGG 550\n",
            r"line 3: section 'Tetraloops' expects 'SEQUENCE energy enthalpy', got 2 fields",
        ),
        (
            "# Triloops\nCAACG 680 2370\n\nGUUAC 690 1080\n",
            r"line 5: section 'Triloops': entry after a blank or comment line",
        ),
        ("# Hexaloops\nACAGUACU 2.8 0\n", r"line 3: section 'Hexaloops': cannot read value '2\.8'"),
        (
            "# Tetraloops\n" + "".join(f"GAA{a}{b}C 100 0\n" for a in "ACGU" for b in "ACGU" for _ in range(3)),
            r"line 43: section 'Tetraloops' has more than 40 entries",
        ),
        ("# NINIO\n 60 320\n", r"line 3: section 'NINIO' expects 3 values, got 2"),
        ("# Tetraloops\ncaacgg 550 690\n", r"line 3: section 'Tetraloops': 'caacgg' is not 6 letters over ACGU"),
    ],
)
def test_malformed_special_and_scalar_sections(tmp_path, body, message):
    path = tmp_path / "s.par"
    path.write_text(HEADER + "\n" + body if not body.startswith("#") else HEADER + body)
    with pytest.raises(ValueError, match=r"s\.par " + message):
        load_parameter_file(path)


def test_dna_special_loops_read_t_as_u(tmp_path):
    path = tmp_path / "dna.par"
    path.write_text(HEADER + "# Triloops\nCTTTG 300 0\n")
    assert "CUUUG" in load_parameter_file(path)["special_hairpins"]


# --------------------------------------------------------------------------- #
# writing
# --------------------------------------------------------------------------- #


def test_save_load_round_trip_and_vienna_reads_it(RNA, tmp_path):
    """Turner 2004 written by foldax, read by ViennaRNA, written by ViennaRNA, read by foldax."""
    ours = tmp_path / "ours.par"
    save_parameter_file(turner2004(jnp.float64), ours, comment="a test\nof comments */")
    assert_params_equal(load_parameter_file(ours, dtype=jnp.float64), turner2004(jnp.float64))
    RNA.params_load(str(ours))
    assert_matches_vienna(turner2004(jnp.float64), RNA)
    theirs = tmp_path / "theirs.par"
    assert RNA.params_save(str(theirs))
    assert_params_equal(load_parameter_file(theirs, dtype=jnp.float64), turner2004(jnp.float64))


def test_save_random_parameters_round_trip(RNA, tmp_path):
    rng = np.random.default_rng(0)
    params = as_np(turner2004(jnp.float64))
    for key in list(TABLE_SHAPES) + list(SCALAR_NAMES):
        if key != "lxc":
            noise = rng.integers(-500, 500, size=np.shape(params[key])) / 100
            params[key] = np.where(np.isinf(params[key]), np.inf, noise)
    for key in CLIPPED_TABLES:
        params[key] = -np.abs(params[key])
    params["int22"] = np.asarray(_with_derived_n(params["int22"]))
    params["special_hairpins"] = {k: rng.integers(-300, 300) / 100 for k in params["special_hairpins"]}
    path = tmp_path / "r.par"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing lossy: no warning
        save_parameter_file(params, path)
    assert_params_equal(load_parameter_file(path, dtype=jnp.float64), params)
    RNA.params_load(str(path))
    assert_matches_vienna(params, RNA, lxc=False)


def _with_derived_n(int22):
    raw = np.full((8, 8, 5, 5, 5, 5), np.inf)
    raw[np.ix_([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], V_BASE, V_BASE, V_BASE, V_BASE)] = int22
    ep._update_nst(raw)
    return raw[np.ix_([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], V_BASE, V_BASE, V_BASE, V_BASE)]


def test_save_warns_about_what_the_format_cannot_carry(tmp_path):
    params = as_np(turner2004(jnp.float64))
    params["dangle3"] = params["dangle3"].copy()
    params["dangle3"][0, 0] = 0.3
    with pytest.warns(UserWarning, match="dangle3 hold positive energies"):
        save_parameter_file(params, tmp_path / "a.par")
    params = as_np(turner2004(jnp.float64))
    params["int22"] = params["int22"].copy()
    params["int22"][0, 0, 4, 0, 0, 0] = -9.0
    with pytest.warns(UserWarning, match="int22 entries with N"):
        save_parameter_file(params, tmp_path / "b.par")
    params["stack"] = params["stack"].copy()
    params["stack"][0, 0] = np.nan
    with pytest.raises(ValueError, match="'stack': it holds NaN"):
        save_parameter_file(params, tmp_path / "c.par")


def test_save_rejects_more_special_hairpins_than_vienna_reads(tmp_path):
    params = as_np(turner2004(jnp.float64))
    params["special_hairpins"] = {f"G{a}{b}{c}AC": 1.0 for a in "ACGU" for b in "ACGU" for c in "AC"}  # 32
    save_parameter_file(params, tmp_path / "ok.par")
    params["special_hairpins"].update({f"C{a}{b}AAG": 1.0 for a in "ACGU" for b in "ACGU"})  # 48
    with pytest.raises(ValueError, match="cannot save 48 Tetraloops: ViennaRNA reads at most 40"):
        save_parameter_file(params, tmp_path / "many.par")


def test_save_rounds_to_dcal(tmp_path):
    params = as_np(turner2004(jnp.float64))
    params["ml_closing"] = np.float64(9.3449)
    save_parameter_file(params, tmp_path / "r.par")
    assert float(load_parameter_file(tmp_path / "r.par", dtype=jnp.float64)["ml_closing"]) == 9.34


def test_check_energy_params_errors():
    params = as_np(turner2004(jnp.float64))
    del params["ninio"]
    with pytest.raises(ValueError, match="lack 'ninio'"):
        check_energy_params(params)
    params = as_np(turner2004(jnp.float64))
    params["special_hairpins"] = {"GAAAC": 1.0, "GNAAC": 1.0}
    with pytest.raises(ValueError, match="'GNAAC'"):
        check_energy_params(params)
    params["special_hairpins"] = {"GAAAC": np.zeros(2)}
    with pytest.raises(ValueError, match="expected a scalar"):
        check_energy_params(params)
