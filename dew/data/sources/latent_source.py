"""``latent_dataset``: a pre-encoded latent data set as a training ``Source``: EDM2's
``dataset_tool.py encode`` output, a directory or a ``.zip``, written by edm2 itself or by
``python -m dew.data.sources.latent_dataset`` (read as edm2 reads it: ``open_latent_dataset``).

The sample field ``image`` holds the *raw* latents, float32 [N, h, w, 2C]: the VAE posterior's
mean ‖ std per image, in sorted file-name order (``read_latent_dataset``). Training draws final latents
from them each step (``config.objective.latent``, ``dew.objectives.latent_space``: mean + ε·std
scaled as edm2's ``encode_latents``), so the encoder never runs while training. ``label`` (int32)
is there when the set has labels and ``use_labels`` is on. As NVlabs/edm2 trains on the whole set,
the ``validation`` split is the same rows as ``train``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dew import registry
from dew.data.dataset import Source
from dew.schema import ConfigError, Key, Section


def latent_dataset(
    split: str = "train", *, path: str = "", use_labels: bool = False, cache: bool = True
) -> Source:
    """The finished latent data set at ``path`` as a ``Source`` (module docstring); ``cache``
    False reads each batch's files when it is drawn (``LatentRows``) instead of all up front."""
    from dew.data.sources.latent_dataset import LatentDatasetError, open_latent_dataset

    if split not in ("train", "validation"):
        raise ValueError(f"latent_dataset: split must be 'train' or 'validation', got {split!r}")
    if not path:
        raise ConfigError(
            "config.dataset.path='' is invalid: expected a latent data set, a directory or .zip "
            "(python -m dew.data.sources.latent_dataset --source=... --dest=DIR, or edm2's encode)"
        )
    try:
        rows, labels = open_latent_dataset(path)
        raw = rows[np.arange(len(rows))] if cache else rows
    except (LatentDatasetError, OSError) as e:
        raise ConfigError(f"config.dataset.path={path!r}: {e}") from None
    fields: dict[str, Any] = {"image": raw}  # the rows (read lazily or cached) and the labels
    num_classes = None
    if use_labels:
        if labels is None:
            raise ConfigError(
                f"config.dataset.path={path!r} holds no labels (dataset.json labels: null) but "
                "use_labels=True; expected use_labels=False"
            )
        fields["label"] = labels.astype(np.int32)
        num_classes = int(labels.max()) + 1
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return Source(name=f"{name}/{split}", fields=fields, num_classes=num_classes, prefetch=0 if cache else 2)


def _config_section() -> Section:
    return Section(
        "a pre-encoded latent data set (python -m dew.data.sources.latent_dataset; edm2's encode)",
        {
            "path": Key("", "the latent data set: a directory or .zip (edm2's encode layout)"),
            "use_labels": Key(False, "read class labels from its dataset.json"),
            "cache": Key(True, "read every latent up front (False: each batch's files when drawn)"),
        },
    )


latent_dataset.config_section = _config_section  # type: ignore[attr-defined]
registry.datasets.register("latent_dataset", latent_dataset)
