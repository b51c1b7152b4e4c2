"""Tests for data.archiveii, data.examples and the ArchiveII TFDS builder.

Fast tests use the hand-made dummy archive in tests/testdata/archiveii/ (see
tests/testdata/make_dummy_archiveii.py). Tests on the real data read the shared
copy, ``<repo>/../shared/data/archiveii/`` (read-only), and are skipped when it
is absent; they are marked slow.
"""

import collections
import csv
import io
import socket
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from foldax.data.archiveii import FAMILIES, NUM_STRUCTURES, examples_from_archive, load_archiveii, recommended_filter
from foldax.data.examples import fold_split_of, load_examples, split_of
from foldax.data.formats import format_records, load_records, parse_records
from foldax.layers.dotbracket import from_dot_bracket, is_nested, pairs_from_table, to_dot_bracket

DUMMY = Path(__file__).resolve().parent / "testdata" / "archiveii" / "archiveII.tar.gz"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "archiveii"
RAW = SHARED / "raw" / "archiveII_ct.tar.gz"
TSV = SHARED / "archiveii.tsv"

needs_shared = pytest.mark.skipif(not (RAW.exists() and TSV.exists()), reason=f"shared ArchiveII not at {SHARED}")


# ------------------------------------------------------------------ dummy data


def test_dummy_archive_examples():
    examples = {ex["id"]: ex for ex in load_archiveii(DUMMY)}
    assert len(examples) == 11
    assert collections.Counter(ex["random_split"] for ex in examples.values()) == {"train": 6, "valid": 2, "test": 3}
    assert {k for k, ex in examples.items() if ex["pseudoknot"]} == {"RNaseP_a", "RNaseP_b"}
    assert (examples["RNaseP_a"]["n_pk_removed"], examples["RNaseP_b"]["n_pk_removed"]) == (3, 2)
    assert examples["tRNA_b"]["dup_of"] == "tRNA_a" and examples["tRNA_a"]["dup_of"] == ""
    assert examples["srp_a"]["n_short_hairpin"] == 1 and not examples["srp_b"]["in_lis"]
    assert examples["16s_X.test_domain1"]["family"] == "16s"
    for ex in examples.values():
        assert is_nested(ex["pair_table"]) and ex["length"] == len(ex["sequence"]) == len(ex["full_pair_table"])
        assert ex["source"].startswith("archiveII.tar.gz!archiveII/")
        assert set(pairs_from_table(ex["pair_table"])) <= set(pairs_from_table(ex["full_pair_table"]))


def test_dummy_folder_equals_tarball(tmp_path):
    with tarfile.open(DUMMY) as tar:
        tar.extractall(tmp_path, filter="data")
    from_dir = examples_from_archive(tmp_path / "archiveII")
    from_tar = examples_from_archive(DUMMY)
    strip = lambda ex: {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ex.items() if k != "source"}
    assert [strip(e) for e in from_dir] == [strip(e) for e in from_tar]


def test_splits_and_filter():
    assert len(load_archiveii(DUMMY, split="valid")) == 2
    fold = load_archiveii(DUMMY, fold="tRNA", split="test")
    assert sorted(ex["id"] for ex in fold) == ["tRNA_a", "tRNA_b", "tRNA_c"]
    train = load_archiveii(DUMMY, fold="tRNA", split="train")
    assert all(ex["family"] != "tRNA" and ex["random_split"] != "valid" for ex in train)
    assert [ex["id"] for ex in load_archiveii(DUMMY, filtered=True) if ex["id"].startswith("srp")] == []
    with pytest.raises(ValueError, match="unknown family"):
        load_archiveii(DUMMY, fold="rRNA")
    with pytest.raises(ValueError, match="unknown split"):
        load_archiveii(DUMMY, split="validation")
    with pytest.raises(FileNotFoundError):
        load_archiveii("/nonexistent/archiveII.tar.gz")


def test_fold_split_rule():
    assert fold_split_of({"family": "5s", "random_split": "valid"}, "tRNA") == "valid"
    assert fold_split_of({"family": "5s", "random_split": "valid"}, None) == "valid"
    assert fold_split_of({"family": "tRNA", "random_split": "valid"}, "tRNA") == "test"


def test_tfds_builder_on_dummy_archive(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from foldax.data.archiveii.archiveii_dataset_builder import Builder

    expected = {"random": {"train": 6, "valid": 2, "test": 3}, "fold_tRNA": {"train": 6, "valid": 2, "test": 3}}
    by_id = {ex["id"]: ex for ex in load_archiveii(DUMMY)}
    for config, sizes in expected.items():
        builder = Builder(config=config, data_dir=str(tmp_path), file_format="array_record")
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(DUMMY.parent)))
        sources = builder.as_data_source()
        assert {k: len(v) for k, v in sources.items()} == sizes
        for split, source in sources.items():
            for i in range(len(source)):
                ex = source[i]
                want = by_id[ex["id"].decode()]
                assert fold_split_of(want, builder.builder_config.held_out) == split
                assert np.array_equal(ex["pair_table"], want["pair_table"])
                assert np.array_equal(ex["full_pair_table"], want["full_pair_table"])
                assert ex["sequence"].decode() == want["sequence"] and ex["length"] == want["length"]
                assert bool(ex["pseudoknot"]) == want["pseudoknot"] and bool(ex["in_lis"]) == want["in_lis"]
                assert ex["n_short_hairpin"] == want["n_short_hairpin"]
    assert [c.name for c in Builder.BUILDER_CONFIGS] == ["random"] + [f"fold_{f}" for f in FAMILIES]
    assert "sloma2016exact" in builder.info.citation


def test_tfds_builder_without_archive_points_at_url(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    from foldax.data.archiveii import URL
    from foldax.data.archiveii.archiveii_dataset_builder import Builder

    requested = []
    monkeypatch.setattr(tfds.download.DownloadManager, "download", lambda self, url: requested.append(url) or DUMMY)
    builder = Builder(config="random", data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare()
    assert requested == [URL]
    assert sum(len(s) for s in builder.as_data_source().values()) == 11


def test_load_examples_user_files(tmp_path):
    text = ">tRNA_one\nGGGAAACCC\n(((...)))\n>x_pk\nGGAAACCAAAGG\n((...[[.))]]\n>x_dup\nGGGAAACCC\n((.....))\n"
    (tmp_path / "mine.dbn").write_text(text)
    examples, report = load_examples(tmp_path)
    assert [ex["family"] for ex in examples] == ["tRNA", "x", "x"]
    assert examples[1]["pseudoknot"] and examples[1]["n_pk_removed"] == 2 and report.pseudoknots_reduced == 1
    assert examples[2]["dup_of"] == "tRNA_one"
    skipped, report = load_examples(tmp_path, pseudoknots="skip", family="mine")
    assert [ex["id"] for ex in skipped] == ["tRNA_one", "x_dup"] and report.skipped["pseudoknot"] == 1
    assert {ex["family"] for ex in skipped} == {"mine"}


def test_split_of_is_deterministic_and_balanced():
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list("ACGU"), 30)) for _ in range(3000)]
    counts = collections.Counter(map(split_of, seqs))
    assert abs(counts["train"] / 3000 - 0.8) < 0.03 and abs(counts["test"] / 3000 - 0.1) < 0.02
    assert [split_of(s) for s in seqs[:50]] == [split_of(s) for s in seqs[:50]]


# ------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def raw_examples():
    return {ex["id"]: ex for ex in load_archiveii(RAW)}


@pytest.fixture(scope="module")
def tsv_rows():
    csv.field_size_limit(sys.maxsize)
    with open(TSV, newline="") as fh:
        return {row["id"]: row for row in csv.DictReader(fh, delimiter="\t")}


@needs_shared
@pytest.mark.slow
def test_all_archiveii_records_load(raw_examples):
    assert len(raw_examples) == NUM_STRUCTURES
    families = collections.Counter(ex["family"] for ex in raw_examples.values())
    assert families == {"5s": 1283, "srp": 928, "tRNA": 557, "tmRNA": 462, "RNaseP": 454, "grp1": 98,
                        "16s": 110, "telomerase": 37, "23s": 35, "grp2": 11}
    assert sum(ex["pseudoknot"] for ex in raw_examples.values()) == 1086
    assert sum(ex["n_pk_removed"] for ex in raw_examples.values()) == 13943
    assert sum(not ex["in_lis"] for ex in raw_examples.values()) == 35
    assert sum(bool(ex["dup_of"]) for ex in raw_examples.values()) == 515
    assert sum(recommended_filter(ex) for ex in raw_examples.values()) == 3706


@needs_shared
@pytest.mark.slow
def test_archiveii_matches_tsv(raw_examples, tsv_rows):
    assert raw_examples.keys() == tsv_rows.keys()
    for rid, ex in raw_examples.items():
        row = tsv_rows[rid]
        pairs = [f"{i + 1}-{j + 1}" for i, j in pairs_from_table(ex["full_pair_table"])]
        assert " ".join(pairs) == row["pairs"], rid
        assert ex["sequence"] == row["sequence"] and ex["family"] == row["family"]
        assert to_dot_bracket(ex["pair_table"]) == row["nested_dot_bracket"], rid
        assert ex["random_split"] == row["random_split"] and ex["dup_of"] == row["dup_of"]
        assert (int(ex["pseudoknot"]), ex["n_pk_removed"], ex["n_short_hairpin"], int(ex["in_lis"])) == (
            int(row["pseudoknot"]), int(row["n_pk_removed"]), int(row["n_short_hairpin"]), int(row["in_lis"]))


@needs_shared
@pytest.mark.slow
def test_tsv_loader_equals_archive_loader(raw_examples):
    from_tsv = load_archiveii(TSV)
    assert len(from_tsv) == NUM_STRUCTURES
    for ex in from_tsv:
        raw = raw_examples[ex["id"]]
        assert np.array_equal(ex["pair_table"], raw["pair_table"])
        assert np.array_equal(ex["full_pair_table"], raw["full_pair_table"])
        assert ex["dup_of"] == raw["dup_of"] and ex["in_lis"] == raw["in_lis"]


@needs_shared
@pytest.mark.slow
def test_generic_loader_on_extracted_archive(tmp_path, raw_examples):
    """ct -> pair table -> dbn -> pair table is the identity for nested structures."""
    with tarfile.open(RAW) as tar:
        tar.extractall(tmp_path, filter="data")
    records, report = load_records(tmp_path / "archiveII", pseudoknots="reduce")
    assert len(records) == NUM_STRUCTURES and report.n_skipped == 0
    assert (report.pseudoknots_reduced, report.pairs_removed) == (1086, 13943)
    nested = [r.replace(id=Path(r.source.rsplit(":", 1)[0]).stem) for r in records
              if not raw_examples[Path(r.source.rsplit(":", 1)[0]).stem]["pseudoknot"]]
    assert len(nested) == NUM_STRUCTURES - 1086
    again = parse_records(format_records(nested, "dbn"), "dbn")
    assert again == nested
    for r in nested[:50]:
        assert np.array_equal(from_dot_bracket(to_dot_bracket(r.pair_table)), r.pair_table)


@needs_shared
@pytest.mark.slow
def test_tfds_builder_on_real_archive(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from foldax.data.archiveii.archiveii_dataset_builder import Builder

    builder = Builder(config="fold_tRNA", data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(RAW.parent)))
    sizes = {k: len(v) for k, v in builder.as_data_source().items()}
    assert sizes == {"train": 3084, "valid": 334, "test": 557}


# ------------------------------------------------------------------ fetching on a fresh machine


def _repacked_dummy(folder: Path) -> Path:
    """A small ArchiveII look-alike tarball built here from the files of tests/testdata/archiveii."""
    with tarfile.open(DUMMY) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    path = folder / "archiveII.tar.gz"
    with tarfile.open(path, "w:gz") as out:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            out.addfile(info, io.BytesIO(members[name]))
    return path


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """No local ArchiveII; downloads go to tmp_path/cache; the 'server' holds a repacked dummy archive."""
    from foldax.data import archiveii

    served = tmp_path / "server"
    served.mkdir()
    tarball = _repacked_dummy(served)
    monkeypatch.delenv("FOLDAX_ARCHIVEII", raising=False)
    monkeypatch.setenv("FOLDAX_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(archiveii, "default_path",
                        lambda: (tmp_path / "cache" / archiveii.FETCHED_NAME) if (tmp_path / "cache" /
                                                                                  archiveii.FETCHED_NAME).exists()
                        else None)
    monkeypatch.setattr(archiveii, "CONTENT_SHA256", archiveii.content_digest(examples_from_archive(tarball)))
    return tarball


def test_load_without_a_local_copy_fetches_through_the_builder_from_a_file_url(fresh_machine, tmp_path, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    from foldax.data import archiveii

    monkeypatch.setattr(archiveii, "URL", fresh_machine.as_uri())
    examples = load_archiveii()  # nothing local: fetched, checked, kept
    assert sorted(ex["id"] for ex in examples) == sorted(ex["id"] for ex in examples_from_archive(DUMMY))
    kept = tmp_path / "cache" / archiveii.FETCHED_NAME
    assert kept.read_bytes() == fresh_machine.read_bytes()
    assert (tmp_path / "cache" / "tfds" / "archiveii" / "random").is_dir()  # the prepared TFDS dataset
    fresh_machine.unlink()  # the source is gone: the kept copy is used, no download
    assert len(load_archiveii(split="test")) == sum(fold_split_of(ex, None) == "test" for ex in examples)
    assert archiveii.fetch_archiveii() == kept


def test_fetch_over_http_checks_the_content(fresh_machine, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    import functools
    import http.server
    import threading

    from foldax.data import archiveii

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(fresh_machine.parent))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{fresh_machine.name}"
    try:
        with pytest.raises(ValueError, match="not ArchiveII's"):  # another digest: nothing kept
            archiveii.fetch_archiveii(url=url, cache=tmp_path / "wrong", expected_sha256="0" * 64)
        assert not (tmp_path / "wrong" / archiveii.FETCHED_NAME).exists()
        path = archiveii.fetch_archiveii(url=url, cache=tmp_path / "http")
    finally:
        server.shutdown()
    assert path.read_bytes() == fresh_machine.read_bytes()


def test_offline_says_so_and_keeps_nothing(fresh_machine, tmp_path, monkeypatch, capsys):
    from foldax.data import archiveii
    from foldax.data.archiveii.__main__ import main as fetch_main

    with socket.socket() as probe:  # a port nobody listens on: connection refused, like a machine offline
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/archiveII.tar.gz"
    monkeypatch.setattr(archiveii, "URL", dead)
    with pytest.raises(archiveii.ArchiveIIUnavailable, match="not downloadable: cannot reach 127.0.0.1"):
        load_archiveii()
    assert fetch_main(["fetch"]) == 3 and "offline?" in capsys.readouterr().err
    assert not (tmp_path / "cache" / archiveii.FETCHED_NAME).exists()
