"""Writes tests/testdata/archiveii/archiveII.tar.gz: a tiny hand-made ArchiveII look-alike.

11 structures in 5 families with the real archive's layout (``archiveII/<id>.ct``,
``archiveII/<family>.lis``, ``archiveII/README.txt``) and its quirks: CT header
variants (``N id``, ``N ENERGY = e id``, ``N dG = e id``, ``N RNA``, an rRNA
domain title "nucleotides a through b"), pseudoknots (two crossing bracket kinds),
a duplicate sequence with another structure, a hairpin shorter than 3, an entry
without pairs that is missing from the ``.lis`` list. Sequences are random and
chosen so that every random split (``data.examples.split_of``) is non-empty.
Deterministic: run ``python -m tests.testdata.make_dummy_archiveii`` from the repo root.
"""

import gzip
import io
import random
import tarfile
from pathlib import Path

from foldax.data.examples import split_of
from foldax.layers.dotbracket import from_dot_bracket

OUT = Path(__file__).resolve().parent / "archiveii" / "archiveII.tar.gz"

# id, wanted random split, structure, header template ({n}, {id}), listed in .lis
RECORDS = [
    ("tRNA_a", "train", "(((((...)))))..((((....))))", "{n}\t{id}", True),
    ("tRNA_b", None, "((((.....))))..((((....))))", "{n}  ENERGY = -12.3  {id}", True),  # dup of tRNA_a
    ("tRNA_c", "test", "((((((....)))..)))..", "   {n} dG = -5.60 [initially -6.10] {id}", True),
    ("5s_a", "train", "((((((...))))))....", "{n}\t{id}", True),
    ("5s_b", "valid", "..(((....)))..((...))", "{n}\t{id}", True),
    ("5s_c", "test", "((((....))))", "{n}\t{id}", True),
    ("RNaseP_a", "train", "((((..[[[..))))..]]]..", "{n}\tRNA", True),
    ("RNaseP_b", "valid", "(((..[[..)))..{{..]]..}}", "{n}\tRNA", True),
    ("srp_a", "train", "((.))...(((...)))", "{n}\t{id}", True),
    ("srp_b", "train", "..........", "{n}\t{id}", False),
    ("16s_X.test_domain1", "test", ".((((....))))..", "{n}\tX.test_domain1 nucleotides 11 through 25", True),
]


def sequence_for(n: int, split: str, rng: random.Random) -> str:
    while True:
        seq = "".join(rng.choice("ACGU") for _ in range(n))
        if split_of(seq) == split:
            return seq


def ct_text(rid: str, seq: str, structure: str, header: str) -> str:
    pt = from_dot_bracket(structure, allow_pseudoknots=True)
    n = len(seq)
    offset = 10 if "domain" in rid else 0  # natural numbering, like the rRNA domains
    lines = [header.format(n=n, id=rid)]
    for i in range(1, n + 1):
        lines.append(f"{i}\t{seq[i - 1]}\t{i - 1}\t{i + 1 if i < n else 0}\t{pt[i - 1] + 1}\t{i + offset}")
    return "\n".join(lines) + "\n"


def main() -> None:
    rng = random.Random(0)
    files = {}
    sequences = {}
    for rid, split, structure, header, _ in RECORDS:
        assert split is not None or len(structure) == len(sequences["tRNA_a"]), rid
        seq = sequences["tRNA_a"] if split is None else sequence_for(len(structure), split, rng)
        sequences[rid] = seq
        files[f"archiveII/{rid}.ct"] = ct_text(rid, seq, structure, header)
    for family in sorted({rid.split("_")[0] for rid, *_ in RECORDS}):
        listed = [rid for rid, *_, lis in RECORDS if lis and rid.split("_")[0] == family]
        files[f"archiveII/{family}.lis"] = "".join(f"{rid}\n" for rid in listed)
    files["archiveII/README.txt"] = "Dummy ArchiveII for unit tests (hand-made, random sequences).\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            data = files[name].encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    with open(OUT, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(RECORDS)} structures)")


if __name__ == "__main__":
    main()
