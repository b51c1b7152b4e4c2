"""``foldax`` command line, run in-process (``foldax.cli.main``) on small real inputs."""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import re
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from foldax import layers
from foldax.data.formats import parse_records
from foldax.cli import main
from foldax.layers.dotbracket import from_dot_bracket, to_dot_bracket, validate_pair_table

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
    """``foldax ARGV`` in this process. A ``fold`` without ``--params``/``--model`` folds with the
    hand-set stacking scores (``--params handset``: quick to compile); the default parameters
    (Turner 2004) have their own tests below."""
    argv = [str(a) for a in argv]
    if argv[:1] == ["fold"] and not {"--params", "--model"} & set(argv):
        argv += ["--params", "handset"]
    rc = main(argv)
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
    headers = [line for line in out.splitlines() if line.startswith(">")]
    assert headers == [">hairpin first record", ">twohp", ">mixed"]  # the whole header, as RNAfold
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
        assert header.split()[0] == f">{rid}" and sequence == seq
        pseudo, log_z = re.fullmatch(r"(\S+) \[log Z = (-?\d+\.\d+)\]", ensemble).groups()  # labelled
        assert len(pseudo) == len(seq) and set(pseudo) <= set(".,|{}()")
        assert float(log_z) == pytest.approx(float(layers.log_partition(params, layers.encode(seq))), abs=0.006)
        assert "frequency of the structure in the ensemble" in frequency
        header = (tmp_path / f"{rid}_bpp.txt").read_text().splitlines()[:2]
        assert all(line.startswith("# ") for line in header) and "1-based" in header[1] and rid in header[0]
        bpp = np.loadtxt(tmp_path / f"{rid}_bpp.txt", ndmin=2)
        i, j, p = bpp[:, 0].astype(int), bpp[:, 1].astype(int), bpp[:, 2]
        assert (1 <= i).all() and (i < j).all() and (j <= len(seq)).all() and (j - i > 3).all()
        assert ((p > 0) & (p <= 1 + 1e-6)).all()
        per_base = np.bincount(i - 1, p, len(seq)) + np.bincount(j - 1, p, len(seq))
        assert per_base.max() <= 1 + 1e-4
        written = (tmp_path / f"{rid}.dbn").read_text()  # the -p lines as comments: still a .dbn file
        commented = ["# " + line for line in lines[5 * k + 3:5 * k + 5]]
        assert written == "\n".join(lines[5 * k:5 * k + 3] + commented) + "\n"
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
    fake = types.ModuleType("foldax.train.main")
    fake.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "foldax.train.main", fake)
    for command in ("train", "eval", "export-params"):
        assert main([command, "--workdir", "w", "--flag"]) == 0
    assert calls == [[c, "--workdir", "w", "--flag"] for c in ("train", "eval", "export-params")]


def test_read_inputs_references_and_structured_files(tmp_path):
    from foldax.data.formats import RnaRecord, write_records
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


# --------------------------------------------------------------------------- #
# paths that do not exist, plots without -o, labels, help
# --------------------------------------------------------------------------- #


def test_argument_that_looks_like_a_path_is_no_such_file(capsys, tmp_path):
    rc, out, err = run(capsys, ["fold", "nonexistent.fa"])
    assert rc == 1 and out == ""
    assert "no such file" in err and "'nonexistent.fa'" in err and "invalid nucleotide" not in err
    rc, _, err = run(capsys, ["fold", f"{tmp_path}/missing", "GGGGAAACCCC"])
    assert rc == 1 and "no such file" in err and "argument 1" in err
    rc, _, err = run(capsys, ["fold", tmp_path])
    assert rc == 1 and "is a directory" in err
    rc, _, err = run(capsys, ["fold", "seqs"])  # letters only: a bad sequence, and not a file either
    assert rc == 1 and "'e' at position 2" in err and "no file named 'seqs'" in err


def test_plot_without_prefix_writes_to_the_current_directory_and_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, ["fold", "GGGGAAACCCC", "--plot"])
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["seq1_arc.png", "seq1_dp.png"]
    assert "current directory" in err and str(tmp_path) in err and "seq1_dp.png" in err and "-o" in err
    assert [r.id for r in parse_records(out, "dbn")] == ["seq1"]  # stdout holds only the fold


def test_plot_titles_name_the_decoder(capsys, tmp_path, monkeypatch):
    from foldax import plots

    seen = []  # what the command asks to draw (the drawing itself is tested in test_plots.py)
    monkeypatch.setattr(plots, "dot_plot", lambda *a, **kw: seen.append(kw) or kw["path"])
    monkeypatch.setattr(plots, "arc_diagram", lambda *a, **kw: kw["path"])
    rc, _, err = run(capsys, ["fold", "GGGGAAACCCC", "--plot", "--mea", "--gamma", "2", "-o", f"{tmp_path}/"])
    assert rc == 0, err
    assert "MEA structure (gamma 2)" in seen[-1]["title"] and seen[-1]["structure_label"] == "MEA structure (gamma 2)"
    rc, _, err = run(capsys, ["fold", "GGGGAAACCCC", "--plot", "-o", f"{tmp_path}/"])
    assert rc == 0, err
    assert "best-scoring structure" in seen[-1]["title"]


def test_scores_are_labelled_and_never_called_energies(capsys, fasta):
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--format", "ct", "-p"])
    assert rc == 0, err
    headers = [line for line in out.splitlines() if not line.split()[0].isdigit() or len(line.split()) != 6]
    assert len(headers) == len(RECORDS)
    params = layers.default_params()
    for header, (rid, seq) in zip(headers, RECORDS.items()):
        assert not re.search(r"(ENERGY|dG)\s*=", header, re.IGNORECASE)  # what CT readers take for kcal/mol
        n, name, rest = header.split("\t", 2)
        assert (int(n), name) == (len(seq), rid)
        score, log_z = re.fullmatch(r"score = (-?\d+\.\d+) \(model log-score, not a free energy\)\t"
                                    r"log Z = (-?\d+\.\d+)", rest).groups()
        tokens = layers.encode(seq)
        assert float(score) == pytest.approx(float(layers.max_score(params, tokens)), abs=0.006)
        assert float(log_z) == pytest.approx(float(layers.log_partition(params, tokens)), abs=1e-4)
    rc, out, _ = run(capsys, ["fold", "GGGGAAACCCC", "--format", "bpseq", "-p"])
    assert "# score = " in out and "not a free energy" in out and "# log Z = " in out


def test_a_model_that_declares_energies_prints_them_rnafold_style():
    """FoldModel.energy_kT: scores are log-weights -E/kT, printed as kcal/mol (the Turner grammar's way)."""
    from foldax.fold import FoldModel, InputRecord, fold_records, format_result

    kt = 0.61632
    params = layers.default_params()
    record = InputRecord("hp", "GGGGAAACCCC")
    [plain] = fold_records(params, [record], partition=True, probs=True)
    [energy] = fold_records(FoldModel(params, energy_kT=kt), [record], partition=True, probs=True)
    assert energy.score == plain.score and energy.energy == pytest.approx(-kt * plain.score)
    lines = format_result(energy, "dbn").splitlines()
    assert lines[2].endswith(f"({-kt * plain.score:6.2f})")
    assert lines[3].endswith(f"[{-kt * plain.log_z:6.2f}]") and "log Z" not in lines[3]
    ct_header = format_result(energy, "ct").splitlines()[0]
    assert ct_header.startswith(f"11\tENERGY = {-kt * plain.score:.2f}\thp")
    assert "score" not in ct_header
    assert "# energy = " in format_result(energy, "bpseq") and "kcal/mol" in format_result(energy, "bpseq")
    assert parse_records(format_result(energy, "ct"), "ct")[0].id == "hp"


def test_help_lists_subcommands_and_the_override_syntax(capsys):
    rc, out, _ = run(capsys, ["--help"])
    assert rc == 0
    commands = " ".join(out.split("options:")[0].split())  # the subcommand list, unwrapped
    for command, purpose in [("fold", "predict secondary structures"), ("plot", "plot the training curves"),
                             ("train", "train (or resume) a model"), ("eval", "metrics of a training workdir"),
                             ("export-params", "write a training workdir's score tensors")]:
        assert f" {command} {purpose}" in commands, command
    assert "--config.a.b=VALUE" in out and re.search(r"--config\.\w+(\.\w+)*=\S+", out)
    rc, out, _ = run(capsys, ["train", "--help"])
    assert rc == 0 and "--config.a.b=VALUE" in out and "--config.data.train_files=" in out
    assert "valid_files" in out and "eval_files" in out and "tiny" in out


# --------------------------------------------------------------------------- #
# --params WORKDIR: the checkpoint (best or latest), the whole model
# --------------------------------------------------------------------------- #


def saved_workdir(path, checkpoints, *, name="stacking", min_hairpin=3, perturb=0.0):
    """A training workdir written without training: config.json and an Orbax checkpoint per
    ``(step, params, validation F1)``; ``perturb`` adds N(0, perturb) noise to a neural model's
    encoder, so that its phi is far from 0. Returns the models saved, by step."""
    from flax import nnx

    from foldax.train import train as trainer
    from foldax.train.main import load_config_file

    config = load_config_file(str(Path(__file__).resolve().parents[1] / "configs" / "tiny.py"))
    config.model.name, config.model.min_hairpin = name, min_hairpin
    config.model.features, config.model.pair_features, config.model.num_layers = 8, 4, 1
    path.mkdir()
    models = {}
    rng = np.random.default_rng(0)
    manager = None
    for step, params, f1 in checkpoints:
        np.savez(path / "init.npz", **{k: np.asarray(v, np.float32) for k, v in params.items()})
        config.model.init = str(path / "init.npz")
        graphdef, state, _ = trainer.create_state(config, 1)
        model, optimizer = nnx.merge(graphdef, state)
        if perturb:
            noisy = jax.tree.map(lambda x: x + perturb * rng.standard_normal(x.shape).astype(x.dtype),
                                 nnx.state(model.encoder, nnx.Param))
            nnx.update(model.encoder, noisy)
        models[step] = model
        manager = manager or trainer.make_checkpoint_manager(str(path), config)
        trainer._save(manager, step, nnx.state((model, optimizer)), None, metrics={"mea/f1": f1}, force=True)
    manager.wait_until_finished()
    manager.close()
    (path / "init.npz").unlink()
    config.model.init = "random"
    (path / "config.json").write_text(config.to_json_best_effort())
    return models


def test_params_workdir_uses_the_best_checkpoint_not_a_stale_npz(capsys, caplog, tmp_path, fasta):
    import logging

    best = {k: np.asarray(v) for k, v in layers.default_params().items()}
    latest = dict(best, pair=np.full((5, 5), -50.0, np.float32))  # nothing pairs
    stale = dict(best, stack=best["stack"] * 3, loop=best["loop"] - 2)  # an old export
    for name, params in (("best", best), ("latest", latest), ("stale", stale)):
        np.savez(tmp_path / f"{name}.npz", **params)
    workdir = tmp_path / "run"
    saved_workdir(workdir, [(10, best, 0.9), (20, latest, 0.1)])
    np.savez(workdir / "params.npz", **stale)  # 'export-params' at an earlier step

    expected = {name: run(capsys, ["fold", "-i", fasta, "--params", tmp_path / f"{name}.npz"])[1]
                for name in ("best", "latest", "stale")}
    assert len(set(expected.values())) == 3  # the three parameter sets fold differently

    with caplog.at_level(logging.WARNING):
        rc, out, err = run(capsys, ["fold", "-i", fasta, "--params", workdir])
    assert rc == 0, err
    assert out == expected["best"]
    assert "best checkpoint, step 10" in err and "validation mea/f1 = 0.9" in err
    assert "newer checkpoints exist (latest: step 20)" in err and "--checkpoint latest" in err
    assert f"{workdir / 'params.npz'} is not used" in err
    assert not [r for r in caplog.records if "read only" in r.getMessage() or "read_only" in r.getMessage()]
    assert "WARNING" not in err

    rc, out, err = run(capsys, ["fold", "-i", fasta, "--params", workdir, "--checkpoint", "latest"])
    assert rc == 0 and out == expected["latest"]
    assert "latest checkpoint, step 20" in err and "newer" not in err

    assert run(capsys, ["fold", "-i", fasta, "--checkpoint", "latest"])[0] == 2  # needs --params WORKDIR


def test_params_neural_workdir_folds_with_its_phi_network(capsys, tmp_path):
    from foldax.layers.decoding import best_structure
    from foldax.layers.structure import structure_score

    params = {k: np.asarray(v) for k, v in layers.default_params().items()}
    workdir = tmp_path / "neural"
    model = saved_workdir(workdir, [(5, params, 0.5)], name="neural", min_hairpin=4, perturb=0.7)[5]
    rc, out, err = run(capsys, ["fold", *RECORDS.values(), "-p", "--params", workdir])
    assert rc == 0, err
    assert "phi network" in err and "WARNING" not in err

    tokens, lengths = layers.encode_batch(list(RECORDS.values()))
    trained, phi = model.scores(tokens, lengths)
    assert float(np.abs(np.asarray(phi)).max()) > 0.5  # a phi that matters
    kw = dict(min_hairpin=4)  # the run's min_hairpin
    tables = np.asarray(best_structure(trained, tokens, lengths, phi=phi, **kw))
    scores = np.asarray(structure_score(trained, tokens, tables, lengths, phi=phi, **kw))
    log_z = np.asarray(layers.log_partition(trained, tokens, lengths, phi=phi, **kw))
    without_phi = np.asarray(layers.max_score(trained, tokens, lengths, **kw))
    assert np.abs(without_phi - scores).max() > 0.1  # folding without phi would print other scores

    records = parse_records("\n".join(line for line in out.splitlines() if "[" not in line and "frequency" not in line),
                            "dbn")
    printed_z = [float(z) for z in re.findall(r"\[log Z = (-?\d+\.\d+)\]", out)]
    for k, (record, score) in enumerate(zip(records, scores_of(out), strict=True)):
        n = record.length
        assert record.pair_table.tolist() == np.where(tables[k, :n] >= n, -1, tables[k, :n]).tolist()
        validate_pair_table(record.pair_table, min_hairpin=4)
        assert score == pytest.approx(float(scores[k]), abs=0.006)
        assert printed_z[k] == pytest.approx(float(log_z[k]), abs=0.006)

    # --sample draws from the ensemble with phi (and the run's min_hairpin): p = exp(score - log Z)
    rc, out, err = run(capsys, ["fold", *RECORDS.values(), "--sample", 30, "--seed", 2, "--params", workdir])
    assert rc == 0, err
    for k, seq in enumerate(RECORDS.values()):
        rows = sample_lines_of(out, seq)
        assert len(rows) == 30
        for structure, value, p in rows:
            table = np.full(tokens.shape[1], -1)
            table[:len(seq)] = from_dot_bracket(structure)
            validate_pair_table(table[:len(seq)], min_hairpin=4)
            score = float(structure_score(trained, tokens[k:k + 1], table[None], lengths[k:k + 1], phi=phi[k:k + 1],
                                          **kw)[0])
            assert value == pytest.approx(score, abs=0.006)
            assert p == pytest.approx(math.exp(score - float(log_z[k])), rel=1e-3)


# --------------------------------------------------------------------------- #
# --params NAME|FILE: shipped parameter sets and parameter files, with provenance
# --------------------------------------------------------------------------- #


def test_shipped_parameter_sets_and_files(tmp_path, capsys):
    from foldax import parameters

    assert parameters.DEFAULT in parameters.mixtures()
    turner, about = parameters.load("turner2004")
    assert layers.is_energy_params(turner) and about.grammar == "turner" and about.name == "turner2004"
    assert "rna_turner2004.json" in about.source and "viennarna_version: 2.8.0" in about.details
    expected = layers.turner2004()
    handset, about = parameters.load("handset")
    assert about.grammar == "stacking" and "not trained" in about.summary
    np.testing.assert_array_equal(handset["stack"], layers.default_params(handset["stack"].dtype)["stack"])

    par = tmp_path / "t.par"  # a ViennaRNA parameter file, and foldax's lossless JSON tables
    layers.save_parameter_file(expected, par)
    for path in (par, layers.__path__[0] + "/data/rna_turner2004.json"):
        loaded, about = parameters.load(str(path))
        assert about.name is None and about.grammar == "turner" and about.source == str(path)
        for key in ("stack", "int22", "hairpin", "ml_closing"):
            np.testing.assert_allclose(loaded[key], expected[key], rtol=1e-6, err_msg=key)  # float32 vs x64
        assert loaded["special_hairpins"].keys() == expected["special_hairpins"].keys()

    scores = {k: np.asarray(v) for k, v in layers.default_params().items()}
    np.savez(tmp_path / "s.npz", provenance=np.asarray('{"data": "ArchiveII", "commit": "abc123"}'), **scores)
    loaded, about = parameters.load(str(tmp_path / "s.npz"))
    assert about.grammar == "stacking" and "commit: abc123" in about.details

    with pytest.raises(FileNotFoundError, match="turner2004, stacking, handset"):
        parameters.load("turner1989")
    (tmp_path / "bad.par").write_text("## RNAfold parameter file v2.0\n# stack\n -240 -330 -210\n")
    with pytest.raises(ValueError, match=r"bad\.par line 3"):
        parameters.load(str(tmp_path / "bad.par"))
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match=r"bad\.json: unknown format 'something else'"):
        parameters.load(str(tmp_path / "bad.json"))  # load_params: unknown format

    rc, out, err = run(capsys, ["fold", "GGGGAAACCCC", "--params", "handset"])
    assert rc == 0 and "parameters: handset: hand-set stacking scores" in err  # stderr names the parameters
    rc, out, err = run(capsys, ["fold", "GGGGAAACCCC", "--params", tmp_path / "s.npz"])
    assert rc == 0 and f"parameters: stacking-model scores from a file ({tmp_path / 's.npz'}; data: ArchiveII" in err
    rc, out, err = run(capsys, ["fold", "GGGGAAACCCC", "--params", "turner1989"])
    assert rc == 1 and out == "" and "neither a shipped parameter set" in err
    assert run(capsys, ["fold", "GGGGAAACCCC", "--params", "handset", "--model", "turner2004"])[0] == 2

    stacking, about = parameters.load("stacking")  # shipped, with the provenance of its training run
    assert about.grammar == "stacking" and "recipe: configs/default.py" in about.details
    assert layers.read_provenance("stacking")["familyfold"]["complete"]


@pytest.mark.parametrize("name, vienna", [("andronescu2007", "Andronescu2007"), ("langdon2018", "Langdon2018"),
                                         ("turner1999", "Turner1999")])
def test_shipped_vienna_parameter_sets_are_viennas(name, vienna, capsys):
    """``andronescu2007`` / ``langdon2018`` / ``turner1999``: the file is what ``RNA.params_save`` writes for that set, and
    its energies are ViennaRNA's under it."""
    import subprocess

    RNA = pytest.importorskip("RNA")
    from foldax import parameters

    script = Path(__file__).resolve().parents[1] / "scripts" / "convert_vienna_params.py"
    check = subprocess.run([sys.executable, str(script), "--par", name, "--check"], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0 and "identical to a fresh RNA.params_save" in check.stdout, check.stdout + check.stderr
    tables, about = parameters.load(name)
    assert about.grammar == "turner" and about.name == name and f"RNA.params_load_RNA_{vienna}" in about.details
    assert about.source == f"layers/data/rna_{name}.par"
    sequence = "GGGAAAUCCGCGCAUAGCGCGAAAGCUUCGGCAAUCCGUACGAUGC"
    getattr(RNA, f"params_load_RNA_{vienna}")()
    try:
        fc = RNA.fold_compound(sequence)
        mfe_structure, mfe = fc.mfe()
        structures = {mfe_structure, *(s.structure for s in fc.subopt(300))}
        expected = {s: fc.eval_structure(s) for s in structures}
    finally:
        RNA.params_load_RNA_Turner2004()  # ViennaRNA's parameters are global: the other tests expect its default
    assert len(expected) > 3
    for structure, energy in expected.items():
        got = float(layers.free_energy(tables, layers.encode(sequence), structure))
        assert got == pytest.approx(energy, abs=2e-3), structure
    rc, out, err = run(capsys, ["fold", sequence, "--params", name])
    assert rc == 0 and f"parameters: {name}: " in err and out.splitlines()[-1].endswith(f" ({mfe:6.2f})")


def test_a_registry_entry_without_its_file_is_a_clear_error(capsys, monkeypatch):
    from foldax import parameters
    from foldax.layers import params_io

    registry = {**parameters.shipped(), "future": {"file": "future.npz", "grammar": "turner", "summary": "later"}}
    monkeypatch.setattr(parameters, "shipped", lambda: registry)
    monkeypatch.setattr(params_io, "shipped_params", lambda: registry)
    rc, _, err = run(capsys, ["fold", "GGGGAAACCCC", "--params", "future"])
    assert rc == 1 and "its file future.npz is not in this installation" in err
    with pytest.raises(FileNotFoundError, match="future.npz is not in this installation"):
        layers.load_params("future")


def test_default_parameters_are_the_trained_mixture(monkeypatch):
    """Without --params: :data:`foldax.parameters.DEFAULT`, the registry's mixture of Turner 2004,
    Turner 1999 and the trained stacking model (folded by MEA at gamma 1, printing Turner 2004's
    energies; checked without folding), measured at full length in its family-fold record."""
    from foldax import fold as F
    from foldax import parameters

    model = F.load_model(None)
    assert parameters.is_mixture(None) and parameters.DEFAULT == "turner2004+turner1999+stacking"
    assert model.energy_kT == pytest.approx(layers.KT) and layers.is_energy_params(model.params)
    assert model.notes[0].startswith(f"parameters: {parameters.DEFAULT}: ")
    assert model.mixture == pytest.approx((0.35, 0.35, 0.3)) and model.mea_gamma == 1.0
    turner, t1999 = layers.load_params("turner2004"), layers.load_params("turner1999")
    np.testing.assert_allclose(model.params["int22"], turner["int22"], rtol=1e-6)  # (float64 here: x64 tests)
    np.testing.assert_allclose(model.members[0]["int22"], t1999["int22"], rtol=1e-6)
    assert not np.array_equal(turner["int22"], t1999["int22"])
    stacking = layers.load_params("stacking")
    assert not layers.is_energy_params(model.members[1])
    np.testing.assert_allclose(model.members[1]["stack"], stacking["stack"], rtol=1e-6)
    assert F.load_model("handset").energy_kT is None
    # its record: every family, full length, above RNAfold on the mean
    record = parameters.mixtures()[parameters.DEFAULT]["familyfold"]["full_length"]
    rows = record["per_family"].values()
    assert len(rows) == 10 and record["mean_of_10"] == pytest.approx(np.mean([r["f1"] for r in rows]), abs=1e-4)
    assert record["mean_of_10"] > record["rnafold_mean_of_10"]
    # the energy-only default (--noLP): the same mixture without its stacking member
    energy = F.load_model(parameters.DEFAULT_ENERGY)
    assert all(layers.is_energy_params(p) for p in (energy.params, *energy.members))
    assert energy.mixture == (0.5, 0.5) and energy.mea_gamma == 0.5
    # From Python: layers.load_mixture; load_params names the mixture's members instead
    mixture = layers.load_mixture(parameters.DEFAULT)
    assert mixture.weights == pytest.approx((0.35, 0.35, 0.3)) and mixture.mea_gamma == 1.0
    np.testing.assert_array_equal(mixture.members[1]["int22"], t1999["int22"])
    with pytest.raises(ValueError, match=r"a mixture of turner2004, turner1999, stacking .*layers.load_mixture"):
        layers.load_params(parameters.DEFAULT)
    with pytest.raises(ValueError, match="a mixture of turner2004, turner1999, stacking"):
        parameters.load(parameters.DEFAULT)
    with pytest.raises(FileNotFoundError, match="not a shipped mixture"):
        layers.load_mixture("turner2004")


# --------------------------------------------------------------------------- #
# the program cache, the progress bar
# --------------------------------------------------------------------------- #


def _jax_cache_as(directory, enabled):
    """Sets JAX's own persistent compilation cache (training tests in this process turn it on);
    returns how it was."""
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()
    return before


@pytest.fixture
def no_jax_cache():
    before = _jax_cache_as(None, False)
    yield
    _jax_cache_as(*before)


@pytest.fixture
def jax_cache(tmp_path):
    before = _jax_cache_as(str(tmp_path / "jax"), True)
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    yield tmp_path / "jax"
    _jax_cache_as(*before)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)


def test_programs_are_kept_on_disk_and_reloaded(tmp_path, capsys, monkeypatch, no_jax_cache):
    from foldax import fold as F
    from foldax import programs

    records = [F.InputRecord(rid, seq) for rid, seq in RECORDS.items()]
    first = programs.FoldPrograms(tmp_path)
    a = F.fold_records(layers.default_params(), records, partition=True, probs=True, programs=first)
    assert first.stats == {"compiled": 1}  # one bucket, one batch: one program
    saved = list((tmp_path / "programs").glob("*.xla"))
    assert len(saved) == 1
    second = programs.FoldPrograms(tmp_path)  # a new run: loaded, not compiled
    b = F.fold_records(layers.default_params(), records, partition=True, probs=True, programs=second)
    assert second.stats == {"disk": 1}
    for x, y in zip(a, b, strict=True):
        assert x.dot_bracket == y.dot_bracket and x.score == y.score and x.log_z == y.log_z
        np.testing.assert_array_equal(x.probs, y.probs)
    F.fold_records(layers.default_params(), records, programs=second)  # another request: another program
    assert second.stats == {"disk": 1, "compiled": 1}, second.stats
    assert len(list((tmp_path / "programs").glob("*.xla"))) == 2

    saved[0].write_bytes(b"not a program")  # damaged: said, compiled again, saved again
    third = programs.FoldPrograms(tmp_path)
    c = F.fold_records(layers.default_params(), records, partition=True, probs=True, programs=third)
    assert third.stats == {"compiled": 1} and [r.dot_bracket for r in c] == [r.dot_bracket for r in a]
    assert "removing the unusable cached program" in capsys.readouterr().err
    assert saved[0].read_bytes() != b"not a program"

    def broken(path, devices):  # loads, but fails when run
        def program(*args):
            raise jax.errors.JaxRuntimeError("NOT_FOUND: Function fusion not found")
        return program

    monkeypatch.setattr(programs, "_read_program", broken)
    fourth = programs.FoldPrograms(tmp_path)
    d = F.fold_records(layers.default_params(), records, partition=True, probs=True, programs=fourth)
    assert fourth.stats == {"disk": 1, "compiled": 1} and [r.score for r in d] == [r.score for r in a]
    assert "failed" in capsys.readouterr().err


def test_a_program_from_jax_own_cache_is_not_saved(tmp_path, jax_cache):
    """An executable JAX loaded from its persistent cache breaks when saved again: never saved."""
    from foldax import fold as F
    from foldax import programs

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    records = [F.InputRecord("hp", "GGGGAAACCCC")]
    F.fold_records(layers.default_params(), records, min_hairpin=5, programs=programs.FoldPrograms(None))
    assert list(jax_cache.iterdir())  # JAX's cache has the program now
    again = programs.FoldPrograms(tmp_path / "ours")
    F.fold_records(layers.default_params(), records, min_hairpin=5, programs=again)
    assert again.stats == {"compiled": 1} and not list((tmp_path / "ours").glob("programs/*.xla"))
    (tmp_path / "ours" / "programs").mkdir(parents=True)
    damaged = tmp_path / "ours" / "programs" / f"{next(iter(again._programs))}.xla"
    damaged.write_bytes(b"damaged")  # an unusable file is removed, not read again on every run
    F.fold_records(layers.default_params(), records, min_hairpin=5, programs=programs.FoldPrograms(tmp_path / "ours"))
    assert not damaged.exists()


def test_program_keys_change_with_what_a_program_depends_on():
    from foldax import programs

    tokens, lengths = layers.encode_batch(["GGGGAAACCCC"])
    args = (layers.default_params(), tokens, lengths, None, np.float32(1))
    key = programs.program_key(programs.Request(), args, 1)
    assert key == programs.program_key(programs.Request(), args, 1)
    others = [programs.program_key(programs.Request(partition=True), args, 1),
              programs.program_key(programs.Request(), args, 2),
              programs.program_key(programs.Request(), (args[0], np.zeros((2, 32), np.int32), *args[2:]), 1),
              programs.program_key(programs.Request(), (layers.turner2004(), *args[1:]), 1),
              programs.program_key(programs.Request(), (jax.tree.map(lambda x: np.asarray(x, np.float64), args[0]),
                                                        *args[1:]), 1)]
    assert len({key, *others}) == 1 + len(others)


def test_a_single_sequence_compiles_as_one_chunk_with_the_same_results(monkeypatch):
    """One sequence (a shell loop's call) runs the DP as one chunk of diagonals, which compiles several
    times faster; a batch keeps the automatic chunks. Both give the same structures and numbers."""
    from foldax import programs

    assert programs.num_chunks_for(1, 128) == 1 and programs.num_chunks_for(1, programs.ONE_CHUNK_MAX_LENGTH) == 1
    assert programs.num_chunks_for(2, 128) is None and programs.num_chunks_for(1, 1024) is None
    seen = []
    traced = programs.fold_batch

    def recording(*args, request):
        seen.append(request.num_chunks)
        return traced(*args, request=request)

    monkeypatch.setattr(programs, "fold_batch", recording)
    params = layers.default_params()
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list("ACGU"), n)) for n in (150, 96)]
    request = programs.Request(partition=True, probs=True, centroid=True)
    run = programs.FoldPrograms(None)
    tokens, lengths = layers.encode_batch(seqs)
    batch = run(request, params, tokens, lengths)
    for row, seq in enumerate(seqs):
        tokens1, lengths1 = layers.encode_batch([seq], buckets=(tokens.shape[1],))
        one = run(request, params, tokens1, lengths1)
        np.testing.assert_array_equal(one["structure"][0], batch["structure"][row])
        np.testing.assert_array_equal(one["centroid"][0], batch["centroid"][row])
        np.testing.assert_allclose(one["log_z"][0], batch["log_z"][row], rtol=1e-5)
        np.testing.assert_allclose(one["probs"][0], batch["probs"][row], atol=1e-5)
    assert seen == [None, 1]  # traced twice: the batch with automatic chunks, then one 1-chunk program
    run(dataclasses.replace(request, num_chunks=2), params, tokens1, lengths1)
    assert seen == [None, 1, 2]  # a caller's explicit count stands


def test_energy_parameters_fold_in_small_batches_split_evenly_over_the_devices(monkeypatch):
    """Turner parameters are folded about 2^18 cells per device a call (smaller batches run faster per
    sequence: BENCHMARKS.md), each call a multiple of the device count; other parameters keep 2^22."""
    from foldax import fold

    records = [fold.InputRecord(f"a{k}", "ACGU" * 50) for k in range(10)]     # 200 nt: bucket 256
    records += [fold.InputRecord(f"b{k}", "ACGU" * 110) for k in range(3)]    # 440 nt: bucket 512
    cells = fold.ENERGY_CELLS_PER_DEVICE
    sizes = [(len(chunk), size) for chunk, size in fold.batches(records, max_cells=2 * cells, multiple=2)]
    assert sizes == [(8, 8), (2, 2), (2, 2), (1, 1)]
    assert [size for _, size in fold.batches(records, max_cells=cells)] == [4, 4, 2, 1, 1, 1]
    assert [size for _, size in fold.batches(records)] == [16, 4]  # the stacking grammar's default
    covered = sorted(k for chunk, _ in fold.batches(records, max_cells=2 * cells, multiple=2) for k in chunk)
    assert covered == list(range(len(records)))

    calls = []
    real = fold.batches
    monkeypatch.setattr(fold, "batches", lambda recs, **kw: calls.append(kw) or real(recs, **kw))
    short = [fold.InputRecord("hp", "GGGGAAACCCC")]
    fold.fold_records(layers.turner2004(), short)
    fold.fold_records(layers.default_params(), short)
    devices = jax.local_device_count()
    assert calls[0]["max_cells"] == cells * devices and calls[0]["multiple"] == devices
    assert calls[1]["max_cells"] == fold.DEFAULT_MAX_CELLS and calls[1]["multiple"] == 1


def test_progress_bar_on_a_terminal_only(capsys, monkeypatch, fasta):
    rc, _, err = run(capsys, ["fold", "-i", fasta])
    assert rc == 0 and "foldax fold:" in err and "seq/s" not in err and "it/s" not in err  # a pipe: no bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["fold", "-i", str(fasta), "--params", "handset"]) == 0
    shown = terminal.getvalue()
    assert "foldax fold" in shown and f"{len(RECORDS)}/{len(RECORDS)}" in shown
    assert "compiling the program for batches of 4 x 32 nt" in shown  # the first use of a program is explained


# --------------------------------------------------------------------------- #
# the Turner model prints RNAfold's numbers
# --------------------------------------------------------------------------- #


def vienna_fold(RNA, seq, *, no_lp=False, constraint=None, enforce=False, temperature=37.0, dangles=2):
    """RNAfold -p's numbers for ``seq`` (ViennaRNA's Python API, md.pf_smooth = 0 as in foldax;
    ``no_lp``: RNAfold --noLP; ``constraint``: RNAfold -C's hard constraint, ``enforce``:
    --enforceConstraint; ``temperature``: -T; ``dangles``: -d)."""
    md = RNA.md()
    md.pf_smooth, md.uniq_ML, md.noLP, md.temperature, md.dangles = 0, 1, int(no_lp), temperature, dangles
    fc = RNA.fold_compound(seq, md)
    if constraint is not None:
        fc.hc_add_from_db(constraint, RNA.CONSTRAINT_DB_DEFAULT | (RNA.CONSTRAINT_DB_ENFORCE_BP if enforce else 0))
    structure, mfe = fc.mfe()
    fc.exp_params_rescale(mfe)
    pseudo, ensemble = fc.pf()
    centroid, distance = fc.centroid()
    return dict(structure=structure, mfe=mfe, pseudo=pseudo, ensemble=ensemble, centroid=centroid,
                centroid_energy=fc.eval_structure(centroid), distance=distance, frequency=fc.pr_energy(mfe),
                diversity=fc.mean_bp_distance(), fc=fc)


def assert_rnafold_lines(lines, want):
    """``foldax fold -p``'s four lines after the sequence are RNAfold -p's (``want``: vienna_fold)."""
    mfe, ensemble, centroid, frequency = lines
    assert mfe == f"{want['structure']} ({want['mfe']:6.2f})"  # RNAfold's line, to the letter
    pseudo, g = re.fullmatch(r"(\S+) \[\s*(-?\d+\.\d\d)\]", ensemble).groups()
    assert pseudo == want["pseudo"] and abs(float(g) - want["ensemble"]) <= 0.005 + 1e-4
    assert centroid == f"{want['centroid']} {{{want['centroid_energy']:6.2f} d={want['distance']:.2f}}}"
    p, d = re.fullmatch(r" frequency of mfe structure in ensemble (\S+); ensemble diversity (\S+)\s*", frequency
                        ).groups()
    assert float(p) == pytest.approx(want["frequency"], rel=1e-4) and abs(float(d) - want["diversity"]) <= 0.006


def test_temperature_prints_rnafold_t_numbers(capsys, fasta):
    """``foldax fold -T 50 -p --params turner2004`` prints ``RNAfold -T 50 -p``'s lines and numbers."""
    RNA = pytest.importorskip("RNA")
    rc, out, err = run(capsys, ["fold", "-i", fasta, "-p", "--params", "turner2004", "-T", "50"])
    assert rc == 0, err
    assert "temperature: 50 C" in err and f"kT = {layers.kt(50.0):.6f}" in err
    lines = out.splitlines()
    for k, (rid, seq) in enumerate(RECORDS.items()):
        assert lines[6 * k + 1] == seq
        assert_rnafold_lines(lines[6 * k + 2:6 * k + 6], vienna_fold(RNA, seq, temperature=50.0))


def test_dangles_0_prints_rnafold_d0_numbers(capsys, fasta):
    """``foldax fold -d0 -p --params turner2004`` prints ``RNAfold -d0 -p``'s lines; -d1 is refused."""
    RNA = pytest.importorskip("RNA")
    rc, out, err = run(capsys, ["fold", "-i", fasta, "-p", "--params", "turner2004", "-d0"])
    assert rc == 0, err
    assert "dangles: 0" in err
    lines = out.splitlines()
    for k, (rid, seq) in enumerate(RECORDS.items()):
        assert lines[6 * k + 1] == seq
        assert_rnafold_lines(lines[6 * k + 2:6 * k + 6], vienna_fold(RNA, seq, dangles=0))
    assert main(["fold", "GGGGAAAACCCC", "--params", "turner2004", "-d1"]) == 2
    assert "invalid choice: 1" in capsys.readouterr().err
    rc, out, err = run(capsys, ["fold", "GGGGAAAACCCC", "--params", "handset", "-d0"])
    assert rc == 2 and "-d0 needs energy parameters" in err


def test_temperature_needs_energy_parameters(capsys):
    rc, out, err = run(capsys, ["fold", "GGGGAAAACCCC", "--params", "handset", "-T", "50"])
    assert rc == 1 and out == ""
    assert "handset: stacking-grammar scores have no temperature; temperature=50 needs Turner energy" in err
    assert main(["fold", "GGGGAAAACCCC", "-T", "-300"]) == 2
    assert "must be a temperature in degrees Celsius above -273.15" in capsys.readouterr().err


@pytest.mark.slow
def test_turner_model_prints_rnafold_numbers(capsys, tmp_path, fasta):
    """``foldax fold -p --model turner2004`` (the unmodified energies) prints RNAfold -p's lines and numbers."""
    RNA = pytest.importorskip("RNA")
    rc, out, err = run(capsys, ["fold", "-i", fasta, "-p", "--model", "turner2004"])
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 6 * len(RECORDS)
    for k, (rid, seq) in enumerate(RECORDS.items()):
        assert lines[6 * k].split()[0] == f">{rid}" and lines[6 * k + 1] == seq
        assert_rnafold_lines(lines[6 * k + 2:6 * k + 6], vienna_fold(RNA, seq))
    # the same energies from a ViennaRNA .par file; MEA structures are evaluated like RNAfold's eval_structure
    par = tmp_path / "turner.par"
    layers.save_parameter_file(layers.turner2004(), par)
    rc, again, _ = run(capsys, ["fold", "-i", fasta, "-p", "--params", par])
    assert rc == 0 and again == out
    rc, out, err = run(capsys, ["fold", "-i", fasta, "--mea", "--model", "turner2004"])
    assert rc == 0, err
    for record, line in zip(parse_records(out, "dbn"), out.splitlines()[2::3], strict=True):
        energy = vienna_fold(RNA, record.sequence)["fc"].eval_structure(record.dot_bracket)
        assert line.endswith(f"({energy:6.2f})")


def test_a_sequence_that_cannot_pair_prints_rnafolds_zero(capsys):
    """No pair is possible (too short, or N only): the open chain's free energy prints as RNAfold's
    ``(  0.00)``, not ``( -0.00)`` (-kT times a zero score is a negative zero)."""
    for seq in ("ACGU", "NNNNNNNN"):
        rc, out, err = run(capsys, ["fold", seq, "--model", "turner2004"])
        assert rc == 0, err
        assert out.splitlines()[2] == "." * len(seq) + " (  0.00)"
    RNA = pytest.importorskip("RNA")
    assert f"{RNA.fold_compound('ACGU').mfe()[1]:6.2f}" == "  0.00"


def test_mea_without_gamma_uses_the_parameter_sets_own(capsys):
    """``--mea`` alone decodes with the parameter set's gamma: 0.5 for turner2004 (the registry's,
    chosen by family-fold on ArchiveII), 1 for a set without one. On this sequence the two differ."""
    from foldax import parameters

    assert parameters.load("turner2004")[1].mea_gamma == 0.5
    assert parameters.load("stacking")[1].mea_gamma == 1.0
    seq = "GCAUUAACAUGGCGUAUACUUAUUCCUUGCAUCGGACGAG"
    own = run(capsys, ["fold", seq, "--mea", "--params", "turner2004"])
    assert own[0] == 0, own[2]
    half = run(capsys, ["fold", seq, "--mea", "--gamma", "0.5", "--params", "turner2004"])
    one = run(capsys, ["fold", seq, "--mea", "--gamma", "1", "--params", "turner2004"])
    assert own[1] == half[1] != one[1]
    plain = run(capsys, ["fold", seq, "--mea", "--params", "stacking"])
    assert plain[1] == run(capsys, ["fold", seq, "--mea", "--gamma", "1", "--params", "stacking"])[1]


def test_the_command_keeps_its_programs_and_imports_no_training_stack(tmp_path):
    """``foldax fold`` as its own process: the second call loads the program the first one saved, and
    the fold path imports nothing of the training stack (TensorFlow, Grain, Orbax, Optax, Flax...)."""
    import os
    import subprocess

    env = dict(os.environ, FOLDAX_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # (the test session's: foldax does not save what JAX's cache gave)
    cmd = [sys.executable, "-X", "importtime", "-m", "foldax.cli", "fold", "--params", "handset", "GGGGAAACCCC"]
    runs, inodes = [], []
    for _ in range(2):  # one sequence (one device), then two (a batch split over both devices)
        runs += [subprocess.run(c, env=env, capture_output=True, text=True, timeout=600)
                 for c in (cmd, cmd + ["GGGAAACCCAGGGGAAACCCC"])]
        assert all(r.returncode == 0 and "failed" not in r.stderr for r in runs), runs[-1].stderr[-3000:]
        inodes.append({p.stat().st_ino for p in (tmp_path / "cache" / "programs").glob("*.xla")})
    assert runs[0].stdout == runs[2].stdout and runs[1].stdout == runs[3].stdout
    assert parse_records(runs[1].stdout, "dbn")[0].dot_bracket == "((((...))))"
    assert len(inodes[0]) == 2 and inodes[1] == inodes[0]  # two programs, loaded (not written again) the second time
    modules = {line.split("|")[-1].strip() for line in runs[0].stderr.splitlines() if line.startswith("import time:")}
    imported = {name.split(".")[0] for name in modules} | {".".join(name.split(".")[:2]) for name in modules}
    assert "jax" in imported and "foldax.layers" in imported
    heavy = {"tensorflow", "tensorflow_datasets", "grain", "orbax", "optax", "flax", "matplotlib", "foldax.train",
             "foldax.model", "tensorboardX", "ml_collections"}
    assert not imported & heavy, imported & heavy


def test_the_program_cache_keeps_the_most_recently_used(tmp_path):
    import os

    from foldax import programs

    for k, size in enumerate((300, 300, 300)):
        path = tmp_path / f"p{k}.xla"
        path.write_bytes(b"x" * size)
        os.utime(path, (1000 + k, 1000 + k))  # p0 used longest ago
    programs._prune(tmp_path, 700)
    assert sorted(p.name for p in tmp_path.glob("*.xla")) == ["p1.xla", "p2.xla"]
    programs._prune(tmp_path, 10)  # the newest always stays
    assert [p.name for p in tmp_path.glob("*.xla")] == ["p2.xla"]


# --------------------------------------------------------------------------- #
# --sample: structures drawn from the ensemble, as RNAsubopt -p --stochBT_en
# --------------------------------------------------------------------------- #

SAMPLE_LINE = re.compile(r"^([.()]+) +(-?\d+\.\d\d) (\S+)$")


def sample_lines_of(out: str, seq: str) -> list[tuple[str, float, float]]:
    """The ``structure value probability`` lines printed for the record of ``seq``."""
    lines = out.splitlines()
    start = lines.index(seq)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith(">"):
            break
        match = SAMPLE_LINE.match(line)
        if match:
            rows.append((match.group(1), float(match.group(2)), float(match.group(3))))
    return rows


def test_sample_prints_viennas_energies_and_ensemble_probabilities(capsys, tmp_path):
    """``foldax fold --sample S --params turner2004``: S lines ``structure E p`` after the MFE line,
    E ViennaRNA's ``eval_structure`` and p its Boltzmann probability ``exp((G - E) / kT)``; the samples'
    frequencies follow p; a seed repeats them; usage errors are clear."""
    RNA = pytest.importorskip("RNA")
    seq, count = "GGGGAAACCCCAUGGGAAACCCAU", 400
    argv = ["fold", seq, "--params", "turner2004", "--sample", count, "--seed", 7]
    rc, out, err = run(capsys, argv)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:2] == [">seq1", seq] and re.fullmatch(r"[.()]+ \(\s*-?\d+\.\d\d\)", lines[2])
    rows = sample_lines_of(out, seq)
    assert len(rows) == count == len(lines) - 3
    want = vienna_fold(RNA, seq)
    fc, kT = want["fc"], layers.kt(37.0)
    for structure, energy, p in rows:
        exact = fc.eval_structure(structure)
        assert abs(energy - exact) <= 0.005 + 1e-6
        assert p == pytest.approx(math.exp((want["ensemble"] - exact) / kT), rel=2e-4)
    frequencies = collections.Counter(structure for structure, _, _ in rows)
    for structure, p in {s: p for s, _, p in rows}.items():  # each structure seen: ~Binomial(count, p)
        assert abs(frequencies[structure] / count - p) <= 4.5 * math.sqrt(p * (1 - p) / count) + 1.5 / count
    assert sum(p for s, _, p in {r[0]: r for r in rows}.values()) > 0.9  # the likely structures were all drawn
    rc, again, err = run(capsys, argv)
    assert rc == 0 and again == out and "seed" not in err
    rc, other, err = run(capsys, argv[:-1] + [8])
    assert rc == 0 and other != out
    rc, fresh, err = run(capsys, argv[:-2] + ["-o", f"{tmp_path}/"])
    seed = int(re.search(r"samples: seed (\d+) \(--seed \1 draws the same samples again\)", err).group(1))
    text = (tmp_path / "seq1_samples.txt").read_text()
    assert text.splitlines()[2:4] == [">seq1", seq] and text.splitlines()[4:] == fresh.splitlines()[3:]
    rc, out, err = run(capsys, argv[:-2] + ["--seed", seed])
    assert rc == 0 and out == fresh
    for extra, message in ((["--format", "ct"], "--sample prints dot-bracket lines"),
                           (["--sample", "0"], "must be >= 1"), (["--seed", str(1 << 32)], "must be an integer in")):
        rc, out, err = run(capsys, argv + extra)
        assert rc == 2 and message in err and out == ""
    rc, out, err = run(capsys, ["fold", seq, "--seed", "1"])
    assert rc == 2 and "--seed needs --sample" in err


def test_many_samples_are_scored_in_chunks_with_the_same_results(monkeypatch):
    """The samples' scores, free energies and probabilities are computed SCORE_CHUNK structures at a
    time (bounded memory for many samples): the same numbers as in one piece, padding rows dropped."""
    from foldax import fold as F
    from foldax import programs

    records = [F.InputRecord("a", "GGGGAAACCCCAUGGGAAACCCAU"), F.InputRecord("b", "GCGCUUCGGCGCAUAGCAUCUAUGC")]
    model = F.load_model("turner2004")
    whole = F.fold_records(model, records, samples=9, key=jax.random.key(3))
    monkeypatch.setattr(programs, "SCORE_CHUNK", 4)  # 18 structures: 5 chunks, 2 rows of padding
    chunked = F.fold_records(model, records, samples=9, key=jax.random.key(3))
    for one, other in zip(whole, chunked, strict=True):
        np.testing.assert_array_equal(one.samples, other.samples)
        for name in ("sample_scores", "sample_energies", "sample_log_probs"):
            np.testing.assert_allclose(getattr(one, name), getattr(other, name), rtol=1e-6)
        assert np.all(np.isfinite(one.sample_energies)) and np.all(one.sample_log_probs <= 1e-6)


@pytest.mark.slow
def test_sample_from_a_mixture_with_constraints_and_without_lonely_pairs(capsys, tmp_path):
    """The default mixture's samples: each probability is the mixture's ``SUM_k w_k p_k(s)`` (from
    :func:`foldax.layers.log_partition` and :func:`foldax.layers.structure_score` of every member), and
    two copies of a sequence in one batch draw different samples. ``-C``: the samples keep the
    constraint and p is the constrained ensemble's (ViennaRNA's hard constraints). ``--noLP-exact``:
    no sample has a lonely pair."""
    from foldax import fold as F
    from foldax import parameters

    RNA = pytest.importorskip("RNA")
    seq, count = "GCGCUUCGGCGCAUAGCAUCUAUGC", 60
    (tmp_path / "two.fa").write_text(f">a\n{seq}\n>b\n{seq}\n")
    rc, out, err = run(capsys, ["fold", "-i", tmp_path / "two.fa", "--model", parameters.DEFAULT, "--sample", count,
                                "--seed", 1])
    assert rc == 0, err
    first, second = out.split(">b\n")
    rows = sample_lines_of(first, seq)
    assert len(rows) == count and rows != sample_lines_of(">b\n" + second, seq)
    model = F.load_model(None)
    tokens = layers.encode(seq)
    sets = (model.params, *model.members)
    log_z = [float(layers.log_partition(p, tokens)) for p in sets]
    for structure, energy, p in rows:
        table = from_dot_bracket(structure)
        scores = [float(layers.structure_score(p, tokens, table)) for p in sets]
        mixed = sum(w * math.exp(s - z) for w, s, z in zip(model.mixture, scores, log_z))
        assert p == pytest.approx(mixed, rel=1e-3)
        assert energy == pytest.approx(float(layers.free_energy(model.params, tokens, table)), abs=0.006)

    constraint = "xxx......................"
    (tmp_path / "c.fa").write_text(f">c\n{seq}\n{constraint}\n")
    rc, out, err = run(capsys, ["fold", "-C", "-i", tmp_path / "c.fa", "--params", "turner2004", "--sample", count])
    assert rc == 0, err
    want = vienna_fold(RNA, seq, constraint=constraint)
    for structure, energy, p in sample_lines_of(out, seq):
        assert structure[:3] == "..."
        exact = want["fc"].eval_structure(structure)
        assert p == pytest.approx(math.exp((want["ensemble"] - exact) / layers.kt(37.0)), rel=2e-4)

    rc, out, err = run(capsys, ["fold", "GGGAAACCCAGGGGAAACCCCAGAAACU", "--params", "turner2004", "--noLP-exact",
                                "--sample", 200])
    assert rc == 0, err
    rows = sample_lines_of(out, "GGGAAACCCAGGGGAAACCCCAGAAACU")
    assert len(rows) == 200
    for structure, _, _ in rows:
        table = from_dot_bracket(structure)
        for i, j in enumerate(table):
            if j > i:  # every pair stacks on (i + 1, j - 1) or (i - 1, j + 1)
                assert table[i + 1] == j - 1 or (i > 0 and table[i - 1] == j + 1), structure
