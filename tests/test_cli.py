"""``foldax`` command line, run in-process (``foldax.cli.main``) on small real inputs."""

from __future__ import annotations

import io
import re
import sys
import types

import numpy as np
import pytest

import layers
from data.formats import parse_records
from foldax.cli import main
from layers.dotbracket import from_dot_bracket, to_dot_bracket, validate_pair_table

# Three short records (all in the 32 bucket: one batched call of 4 per function).
RECORDS = {
    "hairpin": "GGGGAAACCCC",
    "twohp": "GGGAAACCCAGGGGAAACCCC",
    "mixed": "GCGCUUCGGCGCAUAGCAUCUAUGC",
}
FASTA = (
    ">hairpin first record\nggggaaacccc\n"
    "; a comment\n"
    ">twohp\nGGGAAACCCA\nGGGGAAACCCC\n"  # wrapped over two lines
    "\n>mixed\nGCGCTTCGGCGCATAGCATCTATGC\n"  # T reads as U
)


@pytest.fixture
def fasta(tmp_path):
    path = tmp_path / "in.fa"
    path.write_text(FASTA)
    return path


def run(capsys, argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def scores_of(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"^[.()]+ \(\s*(-?\d+\.\d+)\)$", out, re.MULTILINE)]


def test_fold_fasta_several_records(capsys, fasta):
    rc, out, err = run(capsys, ["fold", "-i", fasta])
    assert rc == 0, err
    records = parse_records(out, "dbn")  # the printed text is a valid .dbn file
    assert [r.id for r in records] == list(RECORDS)
    assert [r.sequence for r in records] == list(RECORDS.values())
    params = layers.default_params()
    for record, score in zip(records, scores_of(out), strict=True):
        validate_pair_table(record.pair_table, min_hairpin=3)
        best = float(layers.max_score(params, layers.encode(record.sequence)))
        assert score == pytest.approx(best, abs=0.006)  # the printed structure is the best one
        own = float(layers.structure_score(params, layers.encode(record.sequence), record.pair_table))
        assert own == pytest.approx(best, abs=1e-4)
    assert records[0].dot_bracket == "((((...))))"


def test_fold_stdin_and_arguments(capsys, monkeypatch, fasta):
    rc, expected, _ = run(capsys, ["fold", "-i", fasta])
    assert rc == 0
    structures = [r.dot_bracket for r in parse_records(expected, "dbn")]

    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(RECORDS.values()) + "\n"))
    rc, out, err = run(capsys, ["fold"])  # no arguments: stdin, one sequence per line
    assert rc == 0, err
    records = parse_records(out, "dbn")
    assert [r.id for r in records] == ["seq1", "seq2", "seq3"]
    assert [r.dot_bracket for r in records] == structures

    monkeypatch.setattr(sys, "stdin", io.StringIO(FASTA))
    rc, out, _ = run(capsys, ["fold", "-i", "-"])
    assert rc == 0 and out == expected

    rc, out, _ = run(capsys, ["fold", *RECORDS.values()])  # sequences as arguments
    assert rc == 0
    assert [r.dot_bracket for r in parse_records(out, "dbn")] == structures

    rc, out, _ = run(capsys, ["fold", fasta])  # an existing path as argument is read as a file
    assert rc == 0 and out == expected


def test_invalid_record_names_record_line_and_position(capsys, tmp_path):
    path = tmp_path / "bad.fa"
    path.write_text(">ok1\nGGGGAAACCCC\n>broken\nGGGGAAA\nCCXCC\n>ok2\nGGGAAACCCAGGGGAAACCCC\n>ok3\nGCGCUUCGGCGC\n")
    rc, out, err = run(capsys, ["fold", "-i", path])
    assert rc == 1
    assert out == ""
    assert f"{path}:5" in err  # the line holding the bad letter (wrapped record)
    assert "'broken'" in err
    assert "'X' at position 10" in err  # 1-based position in the sequence
    assert "--skip-invalid" in err

    rc, out, err = run(capsys, ["fold", "-i", path, "--skip-invalid"])
    assert rc == 0
    assert [r.id for r in parse_records(out, "dbn")] == ["ok1", "ok2", "ok3"]
    assert "skipping" in err and "'broken'" in err and f"{path}:5" in err

    rc, out, err = run(capsys, ["fold", "GGGG-AAACCCC"])
    assert rc == 1 and "argument 1" in err and "'-' at position 5" in err


def test_invalid_reference_structure_and_empty_input(capsys, tmp_path, monkeypatch):
    path = tmp_path / "ref.dbn"
    path.write_text(">a\nGGGGAAACCCC\n((((...))))\n>b\nGGGGAAACCCC\n((((...)))\n")
    rc, _, err = run(capsys, ["fold", "-i", path])
    assert rc == 1 and f"{path}:6" in err and "'b'" in err and "length 10" in err

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    rc, out, err = run(capsys, ["fold"])
    assert rc == 1 and out == "" and "no sequences" in err


@pytest.mark.parametrize("fmt", ["dbn", "bpseq", "ct"])
def test_output_formats_read_back(capsys, tmp_path, fasta, fmt):
    rc, dbn_out, _ = run(capsys, ["fold", "-i", fasta])
    expected = parse_records(dbn_out, "dbn")
    prefix = tmp_path / "out" / "run_"
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--format", fmt, "-o", prefix])
    assert rc == 0, err
    files = [tmp_path / "out" / f"run_{rid}.{fmt}" for rid in RECORDS]
    texts = [f.read_text() for f in files]
    from_files = [parse_records(t, fmt, name=str(f))[0] for t, f in zip(texts, files)]
    assert from_files == expected  # same ids, sequences, structures
    if fmt == "bpseq":  # one record per block, blank-line separated
        blocks = out.split("\n\n")
        printed = [parse_records(b, "bpseq")[0] for b in blocks if b.strip()]
        assert [b + "\n" for b in out.rstrip("\n").split("\n\n")] == texts
    else:
        printed = parse_records(out, fmt)
        assert out == "".join(texts)
    assert printed == expected


def test_partition_writes_bpp_and_ensemble_line(capsys, tmp_path, fasta):
    rc, out, err = run(capsys, ["fold", "-i", fasta, "-p", "-o", tmp_path])
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 5 * len(RECORDS)
    params = layers.default_params()
    for k, (rid, seq) in enumerate(RECORDS.items()):
        header, sequence, structure, ensemble, frequency = lines[5 * k:5 * k + 5]
        assert header == f">{rid}" and sequence == seq
        pseudo, log_z = re.fullmatch(r"(\S+) \[\s*(-?\d+\.\d+)\]", ensemble).groups()
        assert len(pseudo) == len(seq) and set(pseudo) <= set(".,|{}()")
        assert float(log_z) == pytest.approx(float(layers.log_partition(params, layers.encode(seq))), abs=0.006)
        assert "frequency of the structure in the ensemble" in frequency
        bpp = np.loadtxt(tmp_path / f"{rid}_bpp.txt", ndmin=2)
        i, j, p = bpp[:, 0].astype(int), bpp[:, 1].astype(int), bpp[:, 2]
        assert (1 <= i).all() and (i < j).all() and (j <= len(seq)).all() and (j - i > 3).all()
        assert ((p > 0) & (p <= 1 + 1e-6)).all()
        per_base = np.bincount(i - 1, p, len(seq)) + np.bincount(j - 1, p, len(seq))
        assert per_base.max() <= 1 + 1e-4
        written = (tmp_path / f"{rid}.dbn").read_text()  # the -p lines as comments: still a .dbn file
        assert written == "\n".join(lines[5 * k:5 * k + 3] + ["# " + line for line in lines[5 * k + 3:5 * k + 5]]) + "\n"
        [record] = parse_records(written, "dbn")
        assert (record.id, record.sequence) == (rid, seq)


def test_mea_and_min_hairpin(capsys, fasta):
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--mea", "--gamma", "4"])
    assert rc == 0, err
    params = layers.default_params()
    for record, score in zip(parse_records(out, "dbn"), scores_of(out), strict=True):
        validate_pair_table(record.pair_table, min_hairpin=3)
        own = float(layers.structure_score(params, layers.encode(record.sequence), record.pair_table))
        assert score == pytest.approx(own, abs=0.006)

    rc, out, _ = run(capsys, ["fold", "-i", fasta, "--min-hairpin", "5"])
    assert rc == 0
    for record in parse_records(out, "dbn"):
        validate_pair_table(record.pair_table, min_hairpin=5)


def test_plot_writes_pngs(capsys, tmp_path):
    import matplotlib.image

    path = tmp_path / "ref.dbn"  # reference structures (drawn in the lower triangle / below the arcs)
    references = ["(((.....)))", "(((...))).((((...))))", "((((....)))).((((...))))."]
    path.write_text("".join(f">{rid}\n{seq}\n{ref}\n" for (rid, seq), ref in zip(RECORDS.items(), references)))
    rc, _, err = run(capsys, ["fold", "-i", path, "--plot", "-o", f"{tmp_path}/plots/"])
    assert rc == 0, err
    for rid in RECORDS:
        for kind in ("dp", "arc"):
            png = tmp_path / "plots" / f"{rid}_{kind}.png"
            assert png.stat().st_size > 5000
            pixels = matplotlib.image.imread(png)
            assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 2


def test_params_npz_and_workdir(capsys, tmp_path, fasta):
    params = {k: np.asarray(v) for k, v in layers.default_params().items()}
    params["pair"] = np.full((5, 5), -50.0, np.float32)  # nothing should pair
    np.savez(tmp_path / "p.npz", **params)
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--params", tmp_path / "p.npz"])
    assert rc == 0, err
    assert all(r.dot_bracket == "." * r.length for r in parse_records(out, "dbn"))

    workdir = tmp_path / "work"
    workdir.mkdir()
    np.savez(workdir / "params.npz", **params)
    rc, out2, _ = run(capsys, ["fold", "-i", fasta, "--params", workdir])
    assert rc == 0 and out2 == out

    np.savez(tmp_path / "bad.npz", stack=params["stack"])
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--params", tmp_path / "bad.npz"])
    assert rc == 1 and out == "" and "missing" in err and "pair" in err


def test_usage_errors(capsys, fasta):
    assert run(capsys, ["fold", "-i", fasta, "--gamma", "2"])[0] == 2  # --gamma needs --mea
    assert run(capsys, ["fold", "-i", fasta, "--format", "xml"])[0] == 2
    assert run(capsys, ["fold", "--min-hairpin", "-1", "ACGU"])[0] == 2
    assert run(capsys, ["nonsense"])[0] == 2
    assert run(capsys, [])[0] == 2
    rc, out, _ = run(capsys, ["fold", "--help"])
    assert rc == 0 and "--skip-invalid" in out


def test_training_subcommands_are_forwarded(capsys, monkeypatch):
    calls = []
    fake = types.ModuleType("train.main")
    fake.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "train.main", fake)
    for command in ("train", "eval", "export-params"):
        assert main([command, "--workdir", "w", "--flag"]) == 0
    assert calls == [[c, "--workdir", "w", "--flag"] for c in ("train", "eval", "export-params")]


def test_read_inputs_references_and_structured_files(tmp_path):
    from data.formats import RnaRecord, write_records
    from foldax.fold import InputError, read_inputs

    dbn = tmp_path / "pk.dbn"  # pseudoknot letters, a score after the structure, a headerless record
    dbn.write_text(">pk\nGGGAAACCCAAAGGGUUUCCC\n(((..AAA)))...aaa....  (-3.10)\nGGGGAAACCCC\n((((...))))\n")
    ct = tmp_path / "two.ct"
    write_records(ct, [RnaRecord("c1", "GGGGAAACCCC", from_dot_bracket("((((...))))")),
                       RnaRecord("c2", "GGGAAACCC", from_dot_bracket("(((...)))"))])
    items = read_inputs([str(dbn), "acgut"], str(ct))
    assert [(r.id, r.sequence) for r in items] == [
        ("pk", "GGGAAACCCAAAGGGUUUCCC"), ("seq1", "GGGGAAACCCC"), ("seq2", "ACGUU"),
        ("c1", "GGGGAAACCCC"), ("c2", "GGGAAACCC")]
    assert to_dot_bracket(items[0].reference, allow_pseudoknots=True) == "(((..[[[)))...]]]...."
    assert to_dot_bracket(items[4].reference) == "(((...)))"
    assert items[2].reference is None and items[0].source == f"{dbn}:1"

    ct.write_text(ct.read_text().replace("2\tG\t1", "2\tX\t1", 1))
    [error, ok] = read_inputs([], str(ct))
    assert isinstance(error, InputError) and f"{ct}:3" in str(error) and "'c1'" in str(error)
    assert ok.id == "c2"
