"""Data: file formats, ArchiveII, user datasets and synthetic data.

* :mod:`foldax.data.formats` -- FASTA / dbn / BPSEQ / CT / TSV readers and writers
  (:func:`~foldax.data.formats.load_records`, :class:`~foldax.data.formats.RnaRecord`).
* :mod:`foldax.data.examples` -- feature dicts shared by all datasets, splits,
  :func:`~foldax.data.examples.load_examples` for a user's own files.
* :mod:`foldax.data.archiveii` -- the ArchiveII benchmark: a plain loader and a
  TensorFlow Datasets builder (``foldax.data.archiveii.archiveii_dataset_builder``).
* :mod:`foldax.data.synthetic` -- sequences with structures sampled from a model.

Importing :mod:`foldax.data` is cheap: TensorFlow Datasets is imported only by the
builder module.
"""

from foldax.data.formats import FormatError, LoadReport, RnaRecord, load_records, read_records, write_records

__all__ = ["FormatError", "LoadReport", "RnaRecord", "load_records", "read_records", "write_records"]
