"""TensorFlow Datasets builder for ArchiveII (``tfds.builder("archiveii/<config>")``).

Configs (see :mod:`foldax.data.archiveii` for the split rules), each with the splits
``train``, ``valid`` and ``test``:

* ``random`` (default) -- SHA-256-of-sequence split, ~80/10/10, equal to the
  ``random_split`` column of ``archiveii.tsv``;
* ``fold_<family>`` for each of the 10 families, e.g. ``fold_tRNA`` -- that
  family is ``test``. One config per fold (rather than 30 split names in one
  config) keeps ``split="train"`` meaning the same thing in every config.

Every split holds all structures it is assigned, unfiltered; filter on the
features (``in_lis``, ``n_short_hairpin``, ``length``) -- e.g. with
:func:`foldax.data.archiveii.recommended_filter`.

Download: the archive comes from :data:`foldax.data.archiveii.URL`. Without internet,
put that ``archiveII.tar.gz`` (or the repacked ``archiveII_ct.tar.gz`` of
``shared/data/archiveii/raw/``) into the manual directory::

    builder = Builder(config="fold_tRNA", data_dir=..., file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=".../archiveii/raw"))
    source = builder.as_data_source()["train"]   # random access, no TensorFlow needed

``file_format="array_record"`` plus ``as_data_source()`` works without
TensorFlow installed and feeds :mod:`foldax.train.input_pipeline` (Grain) directly.
Text features come back as ``bytes``.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from foldax.data.archiveii import ARCHIVE_NAMES, FAMILIES, URL, _check_content, examples_from_archive
from foldax.data.examples import SPLITS, fold_split_of

_TEXT = ("id", "family", "sequence", "random_split", "dup_of", "source")
_INT = ("length", "n_pk_removed", "n_short_hairpin")
_BOOL = ("pseudoknot", "in_lis")
_TABLES = ("pair_table", "full_pair_table")


def features() -> tfds.features.FeaturesDict:
    """The feature spec: the example dict of :mod:`foldax.data.examples` plus ``in_lis``."""
    spec = {k: tfds.features.Text() for k in _TEXT}
    spec.update({k: tfds.features.Scalar(dtype=np.int32) for k in _INT})
    spec.update({k: tfds.features.Scalar(dtype=np.bool_) for k in _BOOL})
    spec.update({k: tfds.features.Tensor(shape=(None,), dtype=np.int32) for k in _TABLES})
    return tfds.features.FeaturesDict(spec)


@dataclasses.dataclass
class ArchiveIIConfig(tfds.core.BuilderConfig):
    """``held_out``: the test family of a family fold, None for the random split."""

    held_out: str | None = None


class Builder(tfds.core.GeneratorBasedBuilder):
    """ArchiveII (Sloma & Mathews 2016), random and leave-one-family-out splits."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: 3,975 structures, random + 10 family-fold configs."}
    BUILDER_CONFIGS = [ArchiveIIConfig(name="random", description="SHA-256 of the sequence, ~80/10/10.")] + [
        ArchiveIIConfig(name=f"fold_{fam}", held_out=fam, description=f"Family {fam} held out as test.")
        for fam in FAMILIES
    ]
    DEFAULT_CONFIG_NAME = "random"
    pkg_dir_path = epath.Path(__file__).parent  # CITATIONS.bib, README.md
    #: Where the archive is downloaded from (an instance may point elsewhere, e.g. a mirror or a file:// URL).
    url = URL
    #: When set, :func:`foldax.data.archiveii.content_digest` the archive must have (else ValueError, nothing kept).
    expected_sha256: str | None = None
    #: The archive used by the last ``download_and_prepare`` (None before, or when it was already prepared).
    archive: Path | None = None

    # tfds 4.9.x infers ``code_path`` through ``importlib_resources``, a package
    # it only declares for Python < 3.9; state it directly instead.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Optional (used when there is no internet): place {' or '.join(ARCHIVE_NAMES)} "
        f"(from {URL}) in the manual directory."
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=features(),
            homepage="https://rna.urmc.rochester.edu/pub/archiveII.tar.gz",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        self.archive = self._archive_path(dl_manager)
        examples = examples_from_archive(self.archive)
        _check_content(self.archive, self.expected_sha256, self.url, examples)
        return {split: self._generate_examples(examples, split) for split in SPLITS}

    def _archive_path(self, dl_manager) -> Path:
        """The archive in the manual directory if there is one, else downloaded from :attr:`url` (a
        ``file://`` URL is read where it is: TFDS copies local files only through TensorFlow)."""
        try:
            manual = Path(dl_manager.manual_dir)
        except AssertionError:  # no manual dir (or empty): download
            parts = urllib.parse.urlparse(self.url)
            if parts.scheme == "file":
                return Path(urllib.request.url2pathname(parts.path))
            return Path(dl_manager.download(self.url))
        for name in ARCHIVE_NAMES:
            if (manual / name).exists():
                return manual / name
        raise FileNotFoundError(f"none of {ARCHIVE_NAMES} in the manual directory {manual}")

    def _generate_examples(self, examples, split):
        for ex in examples:
            if fold_split_of(ex, self.builder_config.held_out) == split:
                yield ex["id"], {k: ex[k] for k in _TEXT + _INT + _BOOL + _TABLES}
