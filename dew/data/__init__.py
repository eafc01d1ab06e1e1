"""Datasets as deterministic, resumable batch streams.

A ``Dataset`` turns an in-memory or random-access source into batches whose order depends only
on (seed, position). The position is JSON bytes, so a checkpoint stores it beside the weights
and a resumed run reads exactly the batches an uninterrupted run would have read.

This package is the training layer's data machinery (``Dataset``, ``DataPartition``, ``Source``,
and the ``config.dataset`` section in ``dew.data.config``); the sources that fill
``dew.datasets`` (digits, the 2D mixture, tfds) are the modality layer's, in ``dew.data.sources``,
and nothing here imports them.
"""

from dew.data.dataset import DataPartition, Dataset, Source

__all__ = ["DataPartition", "Dataset", "Source"]
