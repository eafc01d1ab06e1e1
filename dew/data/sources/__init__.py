"""Dataset sources (modality layer): each registers a ``Source`` factory in ``dew.datasets``.

``digits`` (scikit-learn's embedded 8x8 digits, with captions in ``digits_text``), ``mixture``
(the 2D Gaussian-mixture toy) and ``tfds_source`` (tensorflow-datasets by name, prepared
offline). The batching machinery they feed, ``Dataset``/``DataPartition``/``Source``, is
``dew.data`` (training layer) and imports none of them.
"""
