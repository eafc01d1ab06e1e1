"""A latent data set on disk, read: edm2's ``dataset_tool.py encode`` layout
(``<5 digits>/img-mean-std-<8 digits>.npy``, ``dataset.json``) and the ``encode.json`` record
dew's encoder writes beside it (``dew.data.sources.latent_dataset`` writes both and re-exports
what is here). ``open_latent_dataset`` reads a finished set lazily (``LatentRows``: one ``.npy``
per row lookup, so a set larger than memory trains), ``unpaired`` says whether an image directory
beside it holds another source's images. Anything malformed is one ``LatentDatasetError`` line."""

from __future__ import annotations

import json
import os

import numpy as np

from dew.data.sources.image_folder import ImageFiles, ImageFolderError, read_labels

MANIFEST = "encode.json"
#: What an ``--images_dest``'s own ``encode.json`` records: the keys of ``--dest``'s that decide
#: its images, so a rerun or a reader can tell whose images it holds.
IMAGE_KEYS = ("source", "num_images", "image_shape", "transform")
IMAGES_FORMAT = "edm2 dataset_tool.py convert: the encoded images, PNG"
LABELS_FILE = "dataset.json"


class LatentDatasetError(ValueError):
    """Bad arguments or a ``--dest`` that belongs to another encoding (one line)."""


def image_name(index: int) -> str:
    """edm2 ``dataset_tool.py convert``'s archive name of image ``index``: ``00001/img00001234.png``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img{s}.png"


def latent_name(index: int) -> str:
    """edm2's archive name of image ``index``: ``00001/img-mean-std-00001234.npy``."""
    s = f"{index:08d}"
    return f"{s[:5]}/img-mean-std-{s}.npy"


def read_record(path: str, where: str) -> dict:
    """An ``encode.json`` as the JSON object this command writes; one ``LatentDatasetError`` line
    naming ``where`` and the file otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError) as e:
        raise LatentDatasetError(f"{where}: {path} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict):
        raise LatentDatasetError(f"{where}: {path} holds a JSON {type(record).__name__}, not an object")
    return record


def unpaired(latents: str, images: str) -> list[str]:
    """The ``IMAGE_KEYS`` whose values differ between the ``encode.json`` of a latent data set
    directory and that of an image directory this command wrote beside it (``--images_dest``):
    non-empty when the images are another source's. [] when either holds no record (edm2's own
    output, REPA's ``images/``): nothing to compare."""
    records = [os.path.join(p, MANIFEST) for p in (latents, images)]
    if not all(
        os.path.isdir(p) and os.path.isfile(r) for p, r in zip((latents, images), records, strict=True)
    ):
        return []
    mine, theirs = (read_record(r, where) for r, where in zip(records, ("latents", "images"), strict=True))
    return [k for k in IMAGE_KEYS if mine.get(k) != theirs.get(k)]


#: What ``open_latent_dataset`` accepts, for its error lines.
ACCEPTED_LATENTS = (
    "a directory or .zip of EDM2 latents (<5 digits>/img-mean-std-<8 digits>.npy, float32 [8, h, w], "
    "optional dataset.json), as edm2's dataset_tool.py encode or "
    "python -m dew.data.sources.latent_dataset writes"
)


def _is_integer(index: object) -> bool:
    """An integer scalar (Python or NumPy). A function, so numpy's ``isscalar`` type guard does not
    narrow the caller's ``index`` to scalar types in the other branch."""
    return bool(np.isscalar(index) and np.issubdtype(type(index), np.integer))


def rows_of(table, index, dtype) -> np.ndarray:
    """``table[index]`` for a lazily read table (``table.shape``, ``table._load(i)`` one row): an
    int gives one row, a 1-D index (slice, list, array) the rows stacked, [0, ...] when empty."""
    name = type(table).__name__
    if _is_integer(index):
        return table._load(range(table.shape[0])[int(index)])
    rows = np.arange(table.shape[0])[index]
    if rows.ndim != 1:
        raise IndexError(f"{name}: expected an int or a 1-D index, got shape {rows.shape}")
    if not rows.size:
        return np.empty((0, *table.shape[1:]), dtype)
    return np.stack([table._load(i) for i in rows])


class LatentRows:
    """The raw latents of a finished latent data set, read per lookup: behaves as a float32
    [N, h, w, 2C] array for ``Dataset`` (``shape``, ``dtype``, ``len``, indexing by an index array
    or an int), so a set larger than memory (ImageNet-512: 1.28 M × 128 KiB) trains. Row ``i`` is
    ``files.images[i]`` (the sorted ``.npy`` names), read as edm2's ``ImageFolderDataset`` reads
    it (``np.load``, leading axes folded into the channels) and transposed to HWC."""

    def __init__(self, files: ImageFiles):
        self.files = files
        first = self._load(0)
        self.shape = (len(files.images), *first.shape)
        self.dtype = np.dtype(np.float32)

    def _load(self, i: int) -> np.ndarray:
        name = self.files.images[int(i)]
        with self.files.open(name) as f:
            a = np.load(f, allow_pickle=False)
        stored = f"{a.dtype} {'x'.join(map(str, a.shape))}"
        if a.ndim >= 2:
            a = a.reshape(-1, *a.shape[-2:]).transpose(1, 2, 0)
        first = getattr(self, "shape", None)
        if a.ndim != 3 or a.dtype.kind != "f" or (first is not None and a.shape != first[1:]):
            want = (
                "a float [C, h, w] array"
                if first is None
                else (f"float {first[3]}x{first[1]}x{first[2]} (CHW) as {self.files.images[0]!r}")
            )
            raise LatentDatasetError(
                f"latent_dataset: {self.files.path!r}: {name!r} holds {stored}; expected {want}"
            )
        return np.ascontiguousarray(a, np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        return rows_of(self, index, np.float32)


def open_latent_dataset(path: str) -> tuple[LatentRows, np.ndarray | None]:
    """A finished latent data set, lazily: ``LatentRows`` and the class labels [N] (int64) or None.

    Reads what edm2's ``training/dataset.py`` ``ImageFolderDataset`` reads, from a directory or a
    ``.zip``: every ``.npy`` file at any depth in sorted name order, labels looked up by name in
    ``dataset.json`` (absent or ``"labels": null``: unlabelled). A directory that dew's own
    command is writing (its ``encode.json``) must also be finished: ``dataset.json`` present and
    as many files as the manifest records. Anything else is one ``LatentDatasetError`` line."""
    try:
        files = ImageFiles(
            path, suffixes=frozenset({".npy"}), reader="latent_dataset", accepted=ACCEPTED_LATENTS
        )
        if MANIFEST in files.names:
            with files.open(MANIFEST) as fh:
                count = json.load(fh)["num_images"]
            if LABELS_FILE not in files.names:
                raise LatentDatasetError(f"{path!r} is not a finished latent data set (no {LABELS_FILE})")
            if count != len(files.images):
                raise LatentDatasetError(
                    f"{path!r} holds {len(files.images)} .npy files but its {MANIFEST} records {count}; "
                    "rerun the encode command to finish it"
                )
        return LatentRows(files), read_labels(files)
    except ImageFolderError as e:
        raise LatentDatasetError(str(e)) from None


def read_latent_dataset(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """A finished latent data set: raw latents [N, h, w, 2C] (NHWC, float32: mean ‖ std) in
    ``open_latent_dataset``'s order and the class labels [N] (int64) or None."""
    rows, labels = open_latent_dataset(path)
    return rows[np.arange(len(rows))], labels
