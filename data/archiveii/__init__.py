"""ArchiveII: 3,975 RNA secondary structures in 10 families (Sloma & Mathews 2016).

The Mathews lab distributes it as :data:`URL`, a tarball of one ``.ct`` file per
structure (file stem = id, family = prefix before the first ``_``) plus one
``<family>.lis`` list per family. This module reads it without TensorFlow:

* :func:`load_archiveii` -- a list of example dicts (features of
  :mod:`foldax.data.examples` plus ``in_lis``) from the tarball, a folder of ``.ct``
  files, or the normalised ``archiveii.tsv``; optionally one split of the
  random or a family-fold split, and the recommended filter.
* ``foldax.data.archiveii.archiveii_dataset_builder.Builder`` -- the TensorFlow
  Datasets builder (``tfds.builder("archiveii/fold_tRNA")``), imported
  separately because it imports ``tensorflow_datasets``.
* :func:`fetch_archiveii` -- on a machine without a local copy: downloads
  :data:`URL` through that builder (once; kept in :func:`cache_root`), checks
  its content against :data:`CONTENT_SHA256`, and returns the archive's path.
  :func:`default_path` finds it there afterwards; :func:`load_archiveii` (and so
  ``foldax train``) fetches it when nothing else is found. ``python -m
  foldax.data.archiveii fetch`` does the same from the shell (``scripts/demo.sh``).

Splits (the same for both): ``random`` -- :func:`foldax.data.examples.split_of`
(SHA-256 of the sequence, ~80/10/10, identical sequences together; equal to
the ``random_split`` column of ``archiveii.tsv``); ``fold_<family>`` -- that
family is ``test``, the other nine give ``valid`` (their random ``valid`` part)
and ``train`` (the rest), see :func:`foldax.data.examples.fold_split_of`.

Caveats (see ``shared/data/archiveii/README.md``): 1,086 structures are
pseudoknotted (``pair_table`` holds a maximum nested subset,
``full_pair_table`` every pair); 515 rows repeat a sequence (``dup_of``); 156
have hairpins shorter than 3 (``n_short_hairpin``); 35 are not in the
family lists (``in_lis``: full-length 16S/23S rRNAs whose domains are listed
separately, and 4 SRP entries without pairs). The "nucleotides a through b"
titles of the rRNA domain files are off by one; titles are ignored.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import socket
import sys
import tarfile
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from foldax.data.examples import SPLITS, fold_split_of, make_example, mark_duplicates
from foldax.data.formats import FormatError, RnaRecord, parse_records
from foldax.layers.dotbracket import from_dot_bracket, table_from_pairs

__all__ = [
    "URL",
    "FAMILIES",
    "NUM_STRUCTURES",
    "ARCHIVE_NAMES",
    "CONTENT_SHA256",
    "ArchiveIIUnavailable",
    "cache_root",
    "content_digest",
    "fetch_archiveii",
    "default_path",
    "examples_from_archive",
    "examples_from_tsv",
    "load_archiveii",
    "recommended_filter",
]

URL = "https://rna.urmc.rochester.edu/pub/archiveII.tar.gz"
#: The ten family codes (id prefixes), largest first.
FAMILIES = ("5s", "srp", "tRNA", "tmRNA", "RNaseP", "grp1", "16s", "telomerase", "23s", "grp2")
NUM_STRUCTURES = 3975
#: File names of the archive: as distributed by the Mathews lab, and the
#: repacked copy kept in ``shared/data/archiveii/raw/``.
ARCHIVE_NAMES = ("archiveII.tar.gz", "archiveII_ct.tar.gz")


#: SHA-256 of ArchiveII's content, :func:`content_digest` of its 3,975 structures (computed from
#: the shared copy; the tarball's own bytes depend on how it was packed, so they are not pinned).
CONTENT_SHA256 = "18f712c805555b5994bc87f7856abc3c63cc21733a93366ed3035d9911922e0d"
#: The fetched archive's file name in :func:`cache_root`.
FETCHED_NAME = "archiveII.tar.gz"


class ArchiveIIUnavailable(FileNotFoundError):
    """ArchiveII is neither on this machine nor downloadable now (offline, or the server failed)."""


def cache_root() -> Path:
    """Where a downloaded ArchiveII is kept: ``$FOLDAX_DATA_DIR``, else ``$XDG_CACHE_HOME/foldax/archiveii``
    or ``~/.cache/foldax/archiveii`` (the archive, the TFDS download folder and the prepared dataset)."""
    env = os.environ.get("FOLDAX_DATA_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "foldax" / "archiveii"


def default_path() -> Path | None:
    """The local copy: ``$FOLDAX_ARCHIVEII``, ``<repo>/../shared/data/archiveii/``, or a fetched one.

    Prefers ``archiveii.tsv`` (fast) over the raw tarball, then :func:`cache_root`'s
    ``archiveII.tar.gz`` (see :func:`fetch_archiveii`); None if none exists.
    """
    env = os.environ.get("FOLDAX_ARCHIVEII")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[3] / "shared" / "data" / "archiveii"
    for candidate in [root / "archiveii.tsv"] + [root / "raw" / name for name in ARCHIVE_NAMES]:
        if candidate.exists():
            return candidate
    fetched = cache_root() / FETCHED_NAME
    return fetched if fetched.exists() else None


def content_digest(examples: Sequence[dict]) -> str:
    """SHA-256 of ``id TAB sequence TAB pairs`` lines (every pair ``i-j``, 1-based), sorted by id:
    the same for any packing of the same structures (tarball, folder, TSV)."""
    digest = hashlib.sha256()
    for ex in sorted(examples, key=lambda e: e["id"]):
        pairs = " ".join(f"{i + 1}-{j + 1}" for i, j in enumerate(ex["full_pair_table"].tolist()) if j > i)
        digest.update(f"{ex['id']}\t{ex['sequence']}\t{pairs}\n".encode())
    return digest.hexdigest()


def _check_reachable(url: str, timeout: float) -> None:
    """Fails fast, with a clear message, when the server of an http(s) URL cannot be reached."""
    parts = urllib.parse.urlparse(url)
    if parts.scheme not in ("http", "https"):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as err:
        raise ArchiveIIUnavailable(f"cannot reach {parts.hostname} to download ArchiveII ({err}); offline?") from None


def fetch_archiveii(*, url: str | None = None, cache: str | os.PathLike | None = None,
                    expected_sha256: str | None = None, timeout: float = 10.0) -> Path:
    """ArchiveII's archive on this machine, downloaded through the TFDS builder the first time.

    Runs ``Builder(config="random").download_and_prepare`` from ``url`` (default
    :data:`URL`) with its downloads and prepared dataset under ``cache`` (default
    :func:`cache_root`). Before anything is kept, the archive's content must have the
    :func:`content_digest` ``expected_sha256`` (default :data:`CONTENT_SHA256`; ``""``
    skips the check). The archive is then copied to ``cache/archiveII.tar.gz``, which
    later calls (and :func:`default_path`) use at once, without the network.

    Raises :class:`ArchiveIIUnavailable` when the download is impossible (no network:
    found out within ``timeout`` seconds) and ``ValueError`` when the content is not
    ArchiveII's.
    """
    url = URL if url is None else url
    expected = CONTENT_SHA256 if expected_sha256 is None else (expected_sha256 or None)
    cache = Path(cache_root() if cache is None else cache)
    target = cache / FETCHED_NAME
    if target.exists():
        return target
    _check_reachable(url, timeout)
    try:
        import tensorflow_datasets as tfds

        from foldax.data.archiveii.archiveii_dataset_builder import Builder
    except ImportError as err:
        raise ArchiveIIUnavailable(f"downloading ArchiveII needs tensorflow-datasets ({err})") from None
    builder = Builder(config="random", data_dir=str(cache / "tfds"), file_format="array_record")
    builder.url, builder.expected_sha256 = url, expected
    downloads = cache / "downloads"
    try:
        builder.download_and_prepare(download_dir=str(downloads))  # checks the content as it prepares
        archive = builder.archive
        if archive is None:  # prepared by an earlier call: the download is cached by TFDS
            archive = Path(tfds.download.DownloadManager(download_dir=str(downloads)).download(url))
            _check_content(archive, expected, url)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the download is reported the same way
        raise ArchiveIIUnavailable(f"cannot download ArchiveII from {url}: {type(err).__name__}: {err}") from None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(archive, tmp)
    os.replace(tmp, target)
    return target


def _check_content(archive: str | os.PathLike, expected: str | None, url: str, examples=None) -> None:
    """ValueError unless the archive's :func:`content_digest` is ``expected`` (None: no check)."""
    if expected is None:
        return
    examples = examples_from_archive(archive) if examples is None else examples
    found = content_digest(examples)
    if found != expected:
        raise ValueError(f"{url}: the archive's content (sha256 {found[:12]}..., {len(examples)} structures) is "
                         f"not ArchiveII's (sha256 {expected[:12]}..., {NUM_STRUCTURES} structures); nothing was kept")


def _archive_members(path: Path) -> Iterator[tuple[str, str]]:
    """``(member name, text)`` of every ``.ct`` and ``.lis`` file in a tarball or folder."""
    wanted = (".ct", ".lis")
    if path.is_dir():
        for file in sorted(path.rglob("*")):
            if file.suffix in wanted and file.is_file():
                yield str(file), file.read_text(encoding="utf-8", errors="replace")
        return
    with tarfile.open(path, "r:*") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if member.isfile() and member.name.endswith(wanted):
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                yield f"{path.name}!{member.name}", text


def examples_from_archive(path: str | os.PathLike) -> list[dict]:
    """Examples (sorted by id) from the ArchiveII tarball or an extracted folder of it.

    Every ``.ct`` file must hold exactly one valid structure, else
    :class:`foldax.data.formats.FormatError`. ``in_lis`` is True for ids listed in
    any ``*.lis`` file.
    """
    records, listed = [], set()
    for name, text in _archive_members(Path(path)):
        if name.endswith(".lis"):
            listed.update(line.strip() for line in text.splitlines() if line.strip())
            continue
        parsed = parse_records(text, "ct", name=name, pseudoknots="keep")
        if len(parsed) != 1:
            raise FormatError(f"expected one structure, found {len(parsed)}", path=name, reason="syntax")
        records.append(parsed[0].replace(id=Path(name).stem))
    examples = [make_example(r) for r in sorted(records, key=lambda r: r.id)]
    for ex in examples:
        ex["in_lis"] = ex["id"] in listed
    mark_duplicates(examples)
    return examples


def examples_from_tsv(path: str | os.PathLike) -> list[dict]:
    """Examples from the normalised ``archiveii.tsv`` (``pairs`` column = every pair).

    The nested ``pair_table`` is taken from the ``nested_dot_bracket`` column;
    the other features are recomputed by :func:`foldax.data.examples.make_example`
    and agree with the TSV's columns (a test checks this).
    """
    csv.field_size_limit(sys.maxsize)
    examples = []
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh, delimiter="\t"), start=2):
            n = int(row["length"])
            pairs = [tuple(int(x) - 1 for x in p.split("-")) for p in row["pairs"].split()]
            record = RnaRecord(row["id"], row["sequence"], table_from_pairs(pairs, n), f"{path}:{line}")
            ex = make_example(record, family=row["family"])
            nested = from_dot_bracket(row["nested_dot_bracket"])
            if not np.array_equal(nested, ex["pair_table"]):
                raise FormatError("nested_dot_bracket differs from the maximum nested subset of pairs",
                                  path=str(path), line=line, record=row["id"])
            ex["in_lis"] = row["in_lis"] == "1"
            examples.append(ex)
    mark_duplicates(examples)
    return examples


def recommended_filter(example: dict, max_length: int = 512) -> bool:
    """The README's filter for an O(L^3) nested model: listed, no hairpin < 3, length <= 512."""
    return bool(example["in_lis"]) and example["n_short_hairpin"] == 0 and example["length"] <= max_length


def load_archiveii(
    path: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    fold: str | None = None,
    filtered: bool = False,
) -> list[dict]:
    """ArchiveII examples, sorted by id, without TensorFlow Datasets.

    Args:
      path: ``archiveii.tsv``, the ``.tar.gz`` archive, or a folder of ``.ct``
        files; default :func:`default_path`, and when there is none,
        :func:`fetch_archiveii` (a download; :class:`ArchiveIIUnavailable` offline).
      split: ``"train"``, ``"valid"`` or ``"test"`` to keep one split; None keeps all.
      fold: a family code to use the leave-that-family-out split instead of
        the random one (see :func:`foldax.data.examples.fold_split_of`).
      filtered: apply :func:`recommended_filter`.
    """
    if fold is not None and fold not in FAMILIES:
        raise ValueError(f"unknown family {fold!r}; one of {FAMILIES}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {SPLITS}")
    if path is None and default_path() is None:
        try:
            path = fetch_archiveii()
            print(f"ArchiveII downloaded to {path}", file=sys.stderr)
        except ArchiveIIUnavailable as err:
            raise ArchiveIIUnavailable(f"ArchiveII not found on this machine (../shared/data/archiveii, "
                                       f"$FOLDAX_ARCHIVEII, {cache_root()}) and not downloadable: {err}; pass a "
                                       f"path or set $FOLDAX_ARCHIVEII") from None
    path = Path(path) if path is not None else default_path()
    if path is None or not path.exists():
        raise FileNotFoundError(f"ArchiveII not found at {path}; pass a path or set $FOLDAX_ARCHIVEII")
    examples = examples_from_tsv(path) if path.suffix == ".tsv" else examples_from_archive(path)
    return [
        ex for ex in examples
        if (split is None or fold_split_of(ex, fold) == split) and (not filtered or recommended_filter(ex))
    ]
