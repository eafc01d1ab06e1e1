"""Dataset sources (modality layer): each registers a ``Source`` factory in ``dew.datasets``.

``digits`` (scikit-learn's embedded 8x8 digits, with captions in ``digits_text``), ``mixture``
(the 2D Gaussian-mixture toy), ``tfds_source`` (tensorflow-datasets by name, prepared
offline), ``cifar10`` (tfds's CIFAR-10 as NVlabs/edm trains on it) and ``image_folder``
(NVlabs/edm's own zip/folder format; both share ``image_rows``: x-flip, in-memory cache), and
``latent_dataset`` (``latent_source``: a pre-encoded latent set, edm2's ``dataset_tool.py encode``
layout, written by ``latent_dataset``'s command).
The batching machinery they feed, ``Dataset``/``DataPartition``/``Source``, is ``dew.data``
(training layer) and imports none of them.
"""
