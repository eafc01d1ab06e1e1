"""``latent_dataset``: a pre-encoded latent data set as a training ``Source``: EDM2's
``dataset_tool.py encode`` output, a directory or a ``.zip``, written by edm2 itself or by
``python -m dew.data.sources.latent_dataset`` (read as edm2 reads it: ``open_latent_dataset``).

The sample field ``image`` holds the *raw* latents, float32 [N, h, w, 2C]: the VAE posterior's
mean ‖ std per image, in sorted file-name order (``read_latent_dataset``). Training draws final latents
from them each step (``config.objective.latent``, ``dew.objectives.latent_space``: mean + ε·std
scaled as edm2's ``encode_latents``), so the encoder never runs while training. ``label`` (int32)
is there when the set has labels and ``use_labels`` is on. As NVlabs/edm2 trains on the whole set,
the ``validation`` split is the same rows as ``train``.

``images``: the image data set the latents were encoded from, cropped and resized as they were
(``--transform=center-crop-dhariwal``: ADM's center crop), e.g. REPA's ``images/`` beside its
``vae-sd/`` (sihyun-yu/REPA ``dataset.py``: edm2's ``dataset_tool.py convert`` output) or what
``python -m dew.data.sources.latent_dataset --images_dest=DIR`` writes beside its latents. Row
i of its sorted image files is the field ``pixels`` (uint8 [N, H, W, 3], decoded as REPA's
loader decodes them) beside latent row i, so a representation encoder sees the image while the
network sees its latent (``config.objective.repa.image_field="pixels"``). One image per latent,
a side a whole multiple of the latents' (the same on both axes), and, where both sets have
labels, the same labels; anything else is one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dew import registry
from dew.data.dataset import Source
from dew.schema import ConfigError, Declared, Key, Section


def latent_dataset(
    split: str = "train", *, path: str = "", use_labels: bool = False, cache: bool = True, images: str = ""
) -> Source:
    """The finished latent data set at ``path`` as a ``Source`` (module docstring); ``cache``
    False reads each batch's files when it is drawn (``LatentRows``) instead of all up front;
    ``images``: the image data set whose rows become the ``pixels`` field."""
    from dew.data.sources.latent_reader import LatentDatasetError, open_latent_dataset, unpaired

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
    if images:
        try:
            differ = unpaired(path, images)
        except LatentDatasetError as e:
            raise ConfigError(f"config.dataset.images={images!r}: {e}") from None
        if differ:
            raise ConfigError(
                f"config.dataset.images={images!r} holds the images of another encoding than "
                f"config.dataset.path={path!r} ({', '.join(differ)} differ between their encode.json); "
                "expected the --images_dest written with those latents"
            )
        fields["pixels"] = pixel_rows(images, tuple(rows.shape), labels, cache)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return Source(name=f"{name}/{split}", fields=fields, num_classes=num_classes, prefetch=0 if cache else 2)


class PixelRows:
    """The images of an image data set as uint8 [N, H, W, C] rows read per lookup (``shape``,
    ``dtype``, ``len``, indexing by an int or a 1-D index), every one checked to be [H, W, C]."""

    def __init__(self, files: Any, shape: tuple[int, int, int]):
        self.files = files
        self.shape = (len(files.images), *shape)
        self.dtype = np.dtype(np.uint8)

    def _load(self, i: int) -> np.ndarray:
        from dew.data.sources.image_folder import check_shape

        name = self.files.images[int(i)]
        image = self.files.decode(name)
        check_shape(self.files, name, image.shape, self.shape[1:])
        return image

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        from dew.data.sources.latent_reader import rows_of

        return rows_of(self, index, np.uint8)


def pixel_rows(images: str, latent_shape: tuple[int, ...], labels: np.ndarray | None, cache: bool) -> Any:
    """The ``pixels`` field: the image data set at ``images``, row for row beside latents of
    ``latent_shape`` [N, h, w, 2C] labelled ``labels`` (module docstring); a ``ConfigError``
    naming ``config.dataset.images`` for a set that does not pair with them."""
    from dew.data.sources.image_folder import ImageFiles, ImageFolderError, check_shape, read_labels

    where = f"config.dataset.images={images!r}"
    try:
        files = ImageFiles(images)
        shape = files.decode(files.images[0]).shape
        count, (h, w) = latent_shape[0], latent_shape[1:3]
        if len(files.images) != count:
            raise ConfigError(
                f"{where} holds {len(files.images)} images but config.dataset.path holds {count} latents; "
                "expected one image per latent (the set they were encoded from)"
            )
        if shape[0] % h or shape[1] % w or shape[0] // h != shape[1] // w:
            raise ConfigError(
                f"{where}: images are {shape[0]}x{shape[1]} but the latents {h}x{w}; expected images "
                "a whole multiple of the latents' side, the same on both axes (the VAE's downsampling)"
            )
        image_labels = read_labels(files)
        if labels is not None and image_labels is not None and not np.array_equal(labels, image_labels):
            first = int(np.argmax(labels != image_labels))
            raise ConfigError(
                f"{where}: {files.images[first]!r} is labelled {int(image_labels[first])} but latent row "
                f"{first} {int(labels[first])}; expected the images the latents were encoded from, in order"
            )
        if cache:
            table = []
            for name in files.images:
                table.append(files.decode(name))
                check_shape(files, name, table[-1].shape, shape)
            return np.stack(table)
        for name in files.images[1:]:  # headers only: a mixed set fails here, not mid-run
            check_shape(files, name, files.header_shape(name), shape)
        return PixelRows(files, shape)
    except ImageFolderError as e:
        raise ConfigError(f"{where}: {e}") from None


def _config_section() -> Section:
    return Section(
        "a pre-encoded latent data set (python -m dew.data.sources.latent_dataset; edm2's encode)",
        {
            "path": Key("", "the latent data set: a directory or .zip (edm2's encode layout)"),
            "use_labels": Key(False, "read class labels from its dataset.json"),
            "cache": Key(True, "read every latent up front (False: each batch's files when drawn)"),
            "images": Key(
                "",
                "the image data set the latents were encoded from, as field 'pixels' ('': none)",
            ),
        },
    )


registry.datasets.register("latent_dataset", Declared(latent_dataset, _config_section))
