"""Tests for data.formats: readers, writers, round trips, errors, lenient loading."""

from pathlib import Path

import numpy as np
import pytest

from foldax.data.formats import (
    FORMATS,
    FormatError,
    LoadReport,
    RnaRecord,
    format_of,
    format_records,
    load_records,
    parse_records,
    read_records,
    resolve_paths,
    write_records,
)
from foldax.layers.dotbracket import from_dot_bracket, is_nested

TESTDATA = Path(__file__).resolve().parent / "testdata" / "formats"
STRUCTURED = ("dbn", "ct", "tsv")  # formats holding several structures per file


def rec(rid, seq, db):
    return RnaRecord(rid, seq, from_dot_bracket(db, allow_pseudoknots=True))


NESTED = [rec("hp", "GGGAAACCC", "(((...)))"), rec("two", "GGAAACCUUGAAAUAA", "((...))..(....)."),
          rec("open", "ACGUN", ".....")]
PSEUDOKNOTTED = [rec("pk", "GGAAACCAAAGG", "((...[[.))]]")]


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("fmt", STRUCTURED)
def test_round_trip_records(fmt):
    records = NESTED + PSEUDOKNOTTED
    text = format_records(records, fmt)
    back = parse_records(text, fmt, name=f"x.{fmt}", pseudoknots="keep")
    assert back == records
    assert format_records(back, fmt) == text  # canonical text is a fixed point


@pytest.mark.parametrize("record", NESTED + PSEUDOKNOTTED, ids=lambda r: r.id)
def test_round_trip_bpseq(record):
    text = format_records([record], "bpseq")
    [back] = parse_records(text, "bpseq", pseudoknots="keep")
    assert back == record and format_records([back], "bpseq") == text


def test_round_trip_fasta():
    records = [RnaRecord(r.id, r.sequence, None) for r in NESTED]
    text = format_records(records, "fasta")
    assert parse_records(text, "fasta") == records


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_round_trip_files(tmp_path, fmt):
    records = NESTED[:1] if fmt == "bpseq" else NESTED
    if fmt == "fasta":
        records = [r.replace(pair_table=None) for r in records]
    path = tmp_path / f"data{FORMATS[fmt].extensions[0]}"
    write_records(path, records)
    back = read_records(path)
    assert back == records
    assert all(r.source.startswith(f"{path}:") for r in back)


def test_ct_to_dbn_to_ct_identity():
    ct = (TESTDATA / "example.ct").read_text()
    records = parse_records(ct, "ct")
    dbn = format_records(records, "dbn")
    again = parse_records(format_records(parse_records(dbn, "dbn"), "ct"), "ct")
    assert again == records


def test_writers_need_structures_and_one_bpseq_record():
    with pytest.raises(ValueError, match="has no structure"):
        format_records([RnaRecord("x", "ACGU", None)], "dbn")
    with pytest.raises(ValueError, match="exactly one structure"):
        format_records(NESTED, "bpseq")
    with pytest.raises(ValueError, match="tab or newline"):
        format_records([rec("a\tb", "GAAAC", "(...)")], "tsv")


# ------------------------------------------------------------------- reading


def test_example_files():
    records, report = load_records(str(TESTDATA), pseudoknots="keep")
    by_id = {r.id: r for r in records}
    assert len(records) == 9 and report.n_records == 9 and len(report.files) == 5
    assert by_id["seq1"].sequence == "ACGUACGUNRYK" and by_id["seq1"].pair_table is None
    assert by_id["hp1"].dot_bracket == "(((...)))" and by_id["hp2"].dot_bracket == "(....)"
    assert by_id["tRNA_x"].dot_bracket == "((...))"
    assert by_id["hairpin"].source.endswith("example.dbn:1") and by_id["pk"].source.endswith("example.dbn:4")
    assert by_id["pk"].dot_bracket == "(((...[[[)))...]]]"
    assert by_id["t2"].dot_bracket == "((...[[.))]]"


@pytest.mark.parametrize(
    "header, rid",
    [("5 ENERGY = -1.5 name", "name"), ("5  dG = -21.60  [initially -22.70]  m1", "m1"),
     ("5\tplain title words", "plain"), ("5", "x"), ("  5   RNA", "RNA"), ("5 energy=-1 lower", "lower")],
)
def test_ct_header_variants(header, rid):
    body = "".join(f"{i} {b} {i - 1} {i + 1} {p} {i}\n" for i, b, p in zip(range(1, 6), "GAAAC", [5, 0, 0, 0, 1]))
    [r] = parse_records(f"{header}\n{body}", "ct", name="dir/x.ct")
    assert r.id == rid and r.dot_bracket == "(...)"


def test_missing_ids_use_file_stem():
    one = parse_records("GGAAACC\n((...))\n", "dbn", name="d/my.dbn")
    two = parse_records("GAAAC\n(...)\n\nGAAAC\n.....\n", "dbn", name="d/my.dbn")
    assert [r.id for r in one] == ["my"] and [r.id for r in two] == ["my_1", "my_2"]


def test_dbn_comments_scores_and_case():
    text = "# made by hand\n>a\ngggaaaccc\n(((...)))\t( -1.5 )\n>b\nGGGAAACCC\n(((...))) [2e-3]\n"
    records = parse_records(text, "dbn")
    assert [r.sequence for r in records] == ["GGGAAACCC"] * 2


def test_sequence_normalisation():
    [r] = parse_records(">x\nacgtRYKMSWBDHVn\n", "fasta")
    assert r.sequence == "ACGURYKMSWBDHVN"


def test_fasta_multiline():
    [r] = parse_records(">x desc\nACG\nU\n\nGG\n", "fasta")
    assert r.id == "x" and r.sequence == "ACGUGG"


def test_tsv_extra_columns_any_order():
    text = "note\tstructure\tid\tsequence\nhi\t(...)\tq\tGAAAC\n"
    [r] = parse_records(text, "tsv")
    assert (r.id, r.dot_bracket) == ("q", "(...)")


def test_record_checks_lengths_and_equality():
    with pytest.raises(ValueError, match="pair table has length 3, sequence 4"):
        RnaRecord("x", "ACGU", np.array([-1, -1, -1]))
    a = rec("x", "GAAAC", "(...)")
    assert a == rec("x", "GAAAC", "(...)").replace(source="other:1")
    assert a != rec("x", "GAAAC", ".....") and a != a.replace(pair_table=None)
    with pytest.raises(ValueError):
        a.pair_table[0] = 3  # read-only


# --------------------------------------------------------- malformed input


MALFORMED = [
    # fmt, text, reason, line, fragment
    ("dbn", ">a\nGGAAACC\n((...)\n", "length_mismatch", 3, "structure has length 6 but the sequence has 7"),
    ("dbn", ">a\nGGAAACC\n((...).\n", "unbalanced", 3, "unmatched '(' at column 1"),
    ("dbn", ">a\nGGAAACC\n((...)))\n", "length_mismatch", 3, "length 8"),
    ("dbn", ">a\nGGAAACC\n(.....)\n>b\nGGAAACC\n(....))\n", "unbalanced", 6, "unmatched ')' at column 7"),
    ("dbn", ">a\nGGXAACC\n((...))\n", "bad_letter", 2, "invalid nucleotide 'X' at sequence position 3"),
    ("dbn", ">a\nGGAAACC\n((.?.))\n", "bad_structure", 3, "unexpected character '?' at column 4"),
    ("dbn", ">a\nGGAAACC\n((...)) energy\n", "syntax", 3, "unexpected text after the structure"),
    ("dbn", ">a\nGGAAACC\n", "truncated", 2, "missing structure line"),
    ("dbn", ">a\n>b\nGAAAC\n(...)\n", "truncated", 1, "missing sequence and structure lines"),
    ("fasta", "ACGU\n>a\nACGU\n", "syntax", 1, "sequence line before the first '>' header"),
    ("fasta", ">a\nAC-GU\n", "bad_letter", 1, "invalid nucleotide '-'"),
    ("fasta", ">a\n>b\nACGU\n", "empty", 1, "empty sequence"),
    ("bpseq", "1 G 3\n2 A 0\n3 C 1\n4 A 9\n", "partner", 4, "nucleotide 4 has partner 9, out of range 1..4"),
    ("bpseq", "1 G 3\n2 A 0\n3 C 2\n", "partner", 1, 
     "asymmetric pair: nucleotide 1 pairs with 3 but nucleotide 3 (line 3)"),
    ("bpseq", "1 G 1\n", "partner", 1, "nucleotide 1 is paired with itself"),
    ("bpseq", "1 G 3\n2 A 99999999999999999999\n3 C 1\n", "partner", 2,
     "nucleotide 2 has partner 99999999999999999999, out of range 1..3"),  # beyond int64
    ("bpseq", "1 G 3\n2 A -99999999999999999999\n3 C 1\n", "partner", 2, "out of range 1..3"),
    ("bpseq", "1 G 0\n3 A 0\n", "syntax", 2, "expected nucleotide index 2, found 3"),
    ("bpseq", "1 G 0\n2 A\n", "truncated", 2, "malformed line '2 A'"),
    ("bpseq", "1 G 0\n2 Z 0\n", "bad_letter", 2, "invalid nucleotide 'Z'"),
    ("bpseq", "1 GA 0\n", "bad_letter", 1, "expected one nucleotide letter, found 'GA'"),
    ("bpseq", "# nothing\n", "empty", None, "no 'index base partner' lines"),
    ("ct", "3 x\n1 G 0 2 3 1\n2 A 1 3 0 2\n", "truncated", 1,
     "declares 3 nucleotides but the end of the file follows after 2"),
    ("ct", "3 x\n1 G 0 2 3 1\n2 A 1 3 0 2\n2 y\n1 G 0 2 0 1\n2 C 1 0 0 2\n", "truncated", 1, "line 4 follows after 2"),
    ("ct", "2 x\n1 G 0 2 0 1\n2 A 1 3 0 2\n3 A 2 0 0 3\n", "syntax", 4,
     "more nucleotide lines than the header declares"),
    ("ct", "2 x\n1 G 0 2 5 1\n2 A 1 0 0 2\n", "partner", 2, "nucleotide 1 has partner 5, out of range 1..2"),
    ("ct", "2 x\n1 G 0 2 2 1\n2 A 1 0 0 2\n", "partner", 2, "asymmetric pair: nucleotide 1 pairs with 2"),
    ("ct", "2 x\n1 G 0 2 0 1\n3 A 1 0 0 2\n", "syntax", 3, "expected nucleotide index 2, found 3"),
    ("ct", "title only\n", "syntax", 1, "expected a CT header 'N title'"),
    ("ct", "3 hp\n1 G 0 2 3 1\n2 A 1 3 --0 2\n3 C 2 0 1 3\n", "syntax", 3, "malformed nucleotide line '2 A 1 3 --0 2'"),
    ("ct", "2 x\n1 G 0 2 0 1\n2 A 1 0 \u00b2 2\n", "syntax", 3, "malformed nucleotide line"),  # isdigit() but not int()
    ("ct", "2 x\n1 G 0 2 0 1\n2 A 1 0 18446744073709551617 2\n", "partner", 3,
     "partner 18446744073709551617, out of range"),
    ("ct", "2 x\n1 G 0 2 0 1\n2 J 1 0 0 2\n", "bad_letter", 3, "invalid nucleotide 'J'"),
    ("tsv", "id\tsequence\n", "syntax", 1, "header lacks column(s) structure"),
    ("tsv", "id\tsequence\tstructure\na\tGAAAC\n", "truncated", 2, "expected 3 tab-separated fields, found 2"),
    ("tsv", "id\tsequence\tstructure\na\tGAAAC\t(...).\n", "length_mismatch", 2, "structure has length 6"),
    ("tsv", "", "empty", None, "empty TSV file"),
]


@pytest.mark.parametrize("fmt, text, reason, line, fragment", MALFORMED)
def test_malformed_input_names_file_and_line(tmp_path, fmt, text, reason, line, fragment):
    path = tmp_path / f"bad{FORMATS[fmt].extensions[0]}"
    path.write_text(text)
    with pytest.raises(FormatError) as info:
        read_records(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.reason, err.line, err.path) == (reason, line, str(path))
    where = f"{path}:{line}: " if line else f"{path}: "
    assert str(err).startswith(where), str(err)
    assert fragment in str(err)


@pytest.mark.parametrize("fmt, text, reason, line, fragment", MALFORMED)
def test_lenient_mode_counts(fmt, text, reason, line, fragment):
    report = LoadReport()
    parse_records(text, fmt, strict=False, report=report)
    assert report.skipped[reason] >= 1
    assert any(fragment in e for e in report.errors)


def test_lenient_mode_keeps_good_records():
    text = ">a\nGGAAACC\n((...))\n>b\nGGAAACC\n((...)\n>c\nGGZAACC\n((...))\n>d\nGAAAC\n(...)\n"
    report = LoadReport()
    records = parse_records(text, "dbn", strict=False, report=report)
    assert [r.id for r in records] == ["a", "d"]
    assert dict(report.skipped) == {"length_mismatch": 1, "bad_letter": 1}
    assert report.n_records == 2 and report.n_skipped == 2 and "skipped" in report.summary()


def test_ct_truncated_record_resyncs_at_next_header():
    text = "3 x\n1 G 0 2 3 1\n2 A 1 3 0 2\n2 y\n1 G 0 2 0 1\n2 C 1 0 0 2\n"
    report = LoadReport()
    records = parse_records(text, "ct", strict=False, report=report)
    assert [r.id for r in records] == ["y"] and report.skipped["truncated"] == 1


# --------------------------------------------------------------- pseudoknots


PK_DBN = ">n\nGGGAAACCC\n(((...)))\n>p\nGGAAACCAAAGG\n((...[[.))]]\n"
PK_CT = "4 p\n1 G 0 2 3 1\n2 G 1 3 4 2\n3 C 2 4 1 3\n4 C 3 0 2 4\n"


def test_pseudoknot_reduce():
    report = LoadReport()
    records = parse_records(PK_DBN, "dbn", pseudoknots="reduce", report=report)
    assert [r.dot_bracket for r in records] == ["(((...)))", "((......)).."]
    assert all(is_nested(r.pair_table) for r in records)
    assert (report.pseudoknots_reduced, report.pairs_removed) == (1, 2)


def test_pseudoknot_skip():
    report = LoadReport()
    records = parse_records(PK_DBN, "dbn", pseudoknots="skip", report=report)
    assert [r.id for r in records] == ["n"] and report.skipped["pseudoknot"] == 1


@pytest.mark.parametrize("fmt, text, line", [("dbn", PK_DBN, 4), ("ct", PK_CT, 1)])
def test_pseudoknot_error(fmt, text, line):
    with pytest.raises(FormatError, match=rf"^f\.{fmt}:{line}: pseudoknot: pairs .* cross"):
        parse_records(text, fmt, name=f"f.{fmt}", pseudoknots="error")
    report = LoadReport()
    parse_records(text, fmt, pseudoknots="error", strict=False, report=report)
    assert report.skipped["pseudoknot"] == 1


def test_pseudoknot_keep_and_bad_policy():
    [r] = parse_records(PK_CT, "ct", pseudoknots="keep")
    assert not is_nested(r.pair_table) and r.dot_bracket == "([)]"
    with pytest.raises(ValueError, match="pseudoknots must be one of"):
        parse_records(PK_CT, "ct", pseudoknots="drop")


# ------------------------------------------------------------------- dispatch


def test_format_of():
    assert [format_of(f"a{e}") for e in (".fa", ".FASTA", ".dbn", ".db", ".bpseq", ".ct", ".tsv")] == [
        "fasta", "fasta", "dbn", "dbn", "bpseq", "ct", "tsv"]
    with pytest.raises(ValueError, match="unknown extension '.txt'"):
        format_of("a.txt")


def test_resolve_paths_lists_globs_dirs(tmp_path):
    for name in ("a.dbn", "b.ct", "sub/c.tsv", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    d = str(tmp_path)
    assert resolve_paths(d) == [f"{d}/a.dbn", f"{d}/b.ct", f"{d}/sub/c.tsv"]
    assert resolve_paths(f"{d}/b.ct, {d}/*.dbn,{d}/b.ct") == [f"{d}/b.ct", f"{d}/a.dbn"]
    assert resolve_paths([Path(d) / "sub", f"{d}/**/*.tsv"]) == [f"{d}/sub/c.tsv"]
    with pytest.raises(FileNotFoundError, match="no RNA files found"):
        resolve_paths(f"{d}/*.bpseq")
    with pytest.raises(FileNotFoundError):
        resolve_paths(f"{d}/missing.ct")


def test_load_records_mixed_with_report(tmp_path):
    write_records(tmp_path / "a.dbn", NESTED + PSEUDOKNOTTED)
    (tmp_path / "b.ct").write_text(PK_CT + "2 bad\n1 G 0 2 0 1\n")
    records, report = load_records(f"{tmp_path}/a.dbn,{tmp_path}/b.ct", strict=False, pseudoknots="reduce")
    assert [r.id for r in records] == ["hp", "two", "open", "pk", "p"]
    assert report.pseudoknots_reduced == 2 and report.skipped == {"truncated": 1}
    assert report.files == [f"{tmp_path}/a.dbn", f"{tmp_path}/b.ct"]
    with pytest.raises(FormatError, match=r"b\.ct:6: truncated record"):
        load_records(tmp_path)
