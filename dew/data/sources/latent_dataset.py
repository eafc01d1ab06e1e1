"""Pre-encode an image data set into EDM2's latent data set, once: ``dataset_tool.py encode``.

    python -m dew.data.sources.latent_dataset --source=<images: directory or .zip> --dest=<directory> \
        [--weights=<diffusion_pytorch_model.safetensors>] [--allow_unpinned_weights] \
        [--batch_size=8] [--max_images=N] [--transform=center-crop-dhariwal] [--resolution=512x512] \
        [--images_dest=<directory>] [--pixels=edm2|dit|repa]

The source is an NVlabs/edm / edm2 image data set (``dew.data.sources.image_folder``: same-size
8-bit RGB files, optional ``dataset.json`` labels). ``--transform`` / ``--resolution`` first crop
and resize each image exactly as edm2's ``dataset_tool.py convert`` does
(``dew.data.sources.latent_transforms``; ImageNet-512 is ``--resolution=512x512
--transform=center-crop-dhariwal``), so one command does edm2's ``convert`` then ``encode``, and
the source may then hold images of any size and mode (read as ``convert('RGB')``). Each image
is encoded by the VAE exactly as edm2's ``StabilityVAEEncoder.encode_pixels`` does
(``dew.encoding.stability_vae``: pixels / 255, the posterior's mean and std concatenated; with
``--pixels=dit`` or ``--pixels=repa`` pixels / 127.5 − 1, the [−1, 1] images DiT, SiT and REPA
trained on, as REPA's ``preprocessing/encoders.py``: the run then sets
``config.objective.latent.pixels`` alike), and
stored as edm2's ``dataset_tool.py encode`` stores it, so edm2 and dew read the result alike:

- ``<dest>/<first 5 digits>/img-mean-std-<8-digit index>.npy``: float32 [8, H/8, W/8] (CHW:
  4 mean channels, then 4 std channels);
- ``<dest>/dataset.json``: ``{"labels": [[file, class], ...]}`` or ``{"labels": null}``, written
  last: its presence marks a finished data set.

``--images_dest``: also write each image as it was encoded (after ``--transform`` /
``--resolution``) where edm2's ``dataset_tool.py convert`` writes it (``<5 digits>/img<8
digits>.png``, PNG at compress level 0, and its ``dataset.json``), the layout of REPA's
``images/`` beside its ``vae-sd/``: ``latent_dataset``'s ``images`` reads it back as the
``pixels`` field beside each latent (what REPA's encoder sees). Resumed like the latents: a
rerun writes only the files that are missing. Its own ``encode.json`` records whose images it
holds (``IMAGE_KEYS``: the source, the count, the shape, the transform): a rerun for another
source stops with one line instead of keeping the old images beside the new latents, and
``latent_dataset`` refuses images whose record differs from the latents'.

Training then draws final latents from the stored mean and std (``LatentScaling.encode_latents``)
without running the encoder. Batches are sharded over all local devices (the batch is rounded up
to a multiple of the device count; the last one is padded and the padding dropped).

**Resumable**: every file is written to a temporary name and renamed into place, so a file that
exists is complete, and a killed run's temporary files are removed by the next; ``encode.json``
(written first) records the source, its image count and shape, and the VAE's shape, and a rerun
with the same arguments encodes only the files that are missing. A ``--dest`` or
``--images_dest`` that is a file, cannot be written, or was made from something else stops with
one line before anything is written. Progress
goes to stderr every ``PROGRESS_SECONDS`` and at the end.

Reading (``open_latent_dataset``) takes edm2's own ``encode`` output too, a directory or a
``.zip`` without ``encode.json``, as edm2's ``ImageFolderDataset`` reads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from dew.data.sources.image_folder import ImageFiles, ImageFolderError, read_labels
from dew.data.sources.latent_reader import (
    IMAGE_KEYS,
    IMAGES_FORMAT,
    LABELS_FILE,
    MANIFEST,
    LatentDatasetError,
    image_name,
    latent_name,
    read_record,
)
from dew.data.sources.latent_reader import LatentRows as LatentRows
from dew.data.sources.latent_reader import open_latent_dataset as open_latent_dataset
from dew.data.sources.latent_reader import read_latent_dataset as read_latent_dataset
from dew.data.sources.latent_reader import rows_of as rows_of
from dew.data.sources.latent_reader import unpaired as unpaired

PROGRESS_SECONDS = 10.0


def _png_bytes(image: np.ndarray) -> bytes:
    """``convert``'s PNG: ``PIL.Image.fromarray(img).save(f, format='png', compress_level=0,
    optimize=False)``."""
    import PIL.Image

    f = io.BytesIO()
    PIL.Image.fromarray(image).save(f, format="png", compress_level=0, optimize=False)
    return f.getvalue()


def _write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _npy_bytes(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a, allow_pickle=False)
    return f.getvalue()


#: One jitted, batch-sharded ``encode_pixels`` per codec (its compilations are reused across calls).
_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sharded_encoder(codec):
    import jax

    fn = _ENCODERS.get(codec)
    if fn is None:
        mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("batch",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
        fn = _ENCODERS[codec] = jax.jit(codec.encode_pixels, in_shardings=sharding, out_shardings=sharding)
    return fn


@dataclasses.dataclass
class EncodeReport:
    """What one call did: images in the set, encoded now, and already present."""

    total: int
    encoded: int
    skipped: int


def encode_dataset(
    source: str,
    dest: str,
    codec,
    *,
    batch_size: int = 8,
    max_images: int | None = None,
    transform: str | None = None,
    resolution: tuple[int, int] | None = None,
    progress: Callable[[str], None] | None = None,
    images_dest: str | None = None,
) -> EncodeReport:
    """Encode the image data set at ``source`` into ``dest`` with ``codec`` (a
    ``StabilityVAECodec``); see the module docstring for the format and the resume rule.

    ``transform`` / ``resolution`` (width, height): ``dataset_tool.py convert``'s crop and resize
    applied to each image first (``dew.data.sources.latent_transforms``); either one set reads
    the images as edm2 does (``convert('RGB')``), so they may differ in size and mode.
    ``images_dest``: where the encoded images are also written (module docstring)."""
    import jax
    import jax.numpy as jnp

    from dew.data.sources import latent_transforms

    if not isinstance(batch_size, int) or batch_size < 1:
        raise LatentDatasetError(f"--batch_size={batch_size!r}: expected an int >= 1")
    if max_images is not None and (not isinstance(max_images, int) or max_images < 1):
        raise LatentDatasetError(f"--max_images={max_images!r}: expected an int >= 1 (or none for all)")
    files = ImageFiles(source)
    labels = read_labels(files)
    names = files.images[:max_images] if max_images else files.images
    spec = None
    if transform is not None or resolution is not None:
        width, height = resolution if resolution is not None else (None, None)
        try:
            convert = latent_transforms.make_transform(transform, width, height)
        except ValueError as e:
            raise LatentDatasetError(str(e)) from None
        spec = (transform, width, height)
        kept = kept_images(files, names, spec)
        if labels is not None:
            index = {name: i for i, name in enumerate(files.images)}
            labels = labels[[index[n] for n in kept]]
        names = kept
        if not names:
            raise LatentDatasetError(
                f"--source={source!r}: --transform={transform} --resolution={width}x{height} keeps no image"
            )

        def decode(name: str) -> np.ndarray:
            with files.open(name) as fh:
                image = convert(latent_transforms.load_rgb(fh))
            assert image is not None  # ``names`` holds only the images the transform keeps
            return image

        shape = decode(names[0]).shape
    else:
        decode = files.decode
        shape = files.header_shape(names[0])
    f = codec.config.downsampling
    if shape[2] != codec.config.in_channels or shape[0] % f or shape[1] % f:
        raise LatentDatasetError(
            f"--source={source!r}: images are {shape[0]}x{shape[1]}x{shape[2]}; the VAE takes "
            f"{codec.config.in_channels}-channel images whose sides are multiples of {f}"
        )
    manifest = {
        "source": os.path.abspath(source),
        "num_images": len(names),
        "image_shape": list(shape),
        "vae": dataclasses.asdict(codec.config),
        "transform": None if spec is None else list(spec),
        "format": "edm2 dataset_tool.py encode: float32 [2*latent, H/f, W/f] mean||std per image",
    }
    if codec.pixels.signed:  # edm2's [0, 1] is the unnamed default (earlier manifests hold no key)
        manifest["pixels"] = codec.pixels.name
    # Every check before anything is written: --dest and --images_dest each new, or holding what
    # this command wrote there for the same source (its images: the keys IMAGE_KEYS of the record).
    if images_dest is not None and os.path.abspath(images_dest) == os.path.abspath(dest):
        raise LatentDatasetError(f"--images_dest={images_dest!r} is --dest; expected a directory of its own")
    outputs = [("--dest", dest, manifest)]
    if images_dest is not None:
        pictured = {k: manifest[k] for k in IMAGE_KEYS} | {"format": IMAGES_FORMAT}
        outputs.append(("--images_dest", images_dest, pictured))
    fresh = [_check_output(flag, path, record) for flag, path, record in outputs]
    for (_, path, record), new in zip(outputs, fresh, strict=True):
        if new:
            _write_atomic(os.path.join(path, MANIFEST), json.dumps(record, indent=1).encode())
        for root, _dirs, found in os.walk(path):  # a killed run's partial files: never renamed into place
            for name in found:
                if ".tmp-" in name:
                    os.remove(os.path.join(root, name))
    todo = [i for i in range(len(names)) if not os.path.isfile(os.path.join(dest, latent_name(i)))]
    pictures = set()
    if images_dest is not None:
        pictures = {
            i for i in range(len(names)) if not os.path.isfile(os.path.join(images_dest, image_name(i)))
        }
    work = sorted(set(todo) | pictures)
    encoding = set(todo)
    devices = jax.devices()
    per_call = -(-batch_size // len(devices)) * len(devices)
    encode = _sharded_encoder(codec)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    done, last = 0, time.monotonic()
    for start in range(0, len(work), per_call):
        chunk = work[start : start + per_call]
        decoded = {i: _checked(decode(names[i]), shape, names[i], source) for i in chunk}
        for i in pictures.intersection(chunk):
            _write_atomic(os.path.join(images_dest or "", image_name(i)), _png_bytes(decoded[i]))
        chunk = [i for i in chunk if i in encoding]
        if not chunk:
            continue
        batch = np.stack([decoded[i] for i in chunk])
        if len(chunk) < per_call:  # pad to the sharded size; the padding is dropped
            batch = np.concatenate([batch, np.repeat(batch[-1:], per_call - len(chunk), axis=0)])
        raw = np.asarray(encode(jnp.asarray(batch)))[: len(chunk)]
        for i, mean_std in zip(chunk, raw, strict=True):
            _write_atomic(os.path.join(dest, latent_name(i)), _npy_bytes(mean_std.transpose(2, 0, 1)))
        done += len(chunk)
        if time.monotonic() - last >= PROGRESS_SECONDS or start + per_call >= len(work):
            say(f"encode: {len(names) - len(todo) + done}/{len(names)} images")
            last = time.monotonic()
    entries = None if labels is None else [[latent_name(i), int(labels[i])] for i in range(len(names))]
    if images_dest is not None:
        pictured = None if labels is None else [[image_name(i), int(labels[i])] for i in range(len(names))]
        _write_atomic(os.path.join(images_dest, LABELS_FILE), json.dumps({"labels": pictured}).encode())
    _write_atomic(os.path.join(dest, LABELS_FILE), json.dumps({"labels": entries}).encode())
    return EncodeReport(total=len(names), encoded=len(todo), skipped=len(names) - len(todo))


def _check_output(flag: str, path: str, record: dict) -> bool:
    """``path`` (``flag``'s directory) must be one this command can write: new (returns True:
    its record is to be written), or holding the record ``record`` of this same encoding
    (False). A file, a directory it cannot write, one holding another encoding's record or
    other files without one: ``LatentDatasetError`` naming the flag, before anything is written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise LatentDatasetError(
            f"{flag}={path!r} is a file; expected a directory (new, or this command's own)"
        )
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise LatentDatasetError(
            f"{flag}={path!r} lies under {existing!r}, which is a file; expected a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise LatentDatasetError(
            f"{flag}={path!r}: {existing!r} is not writable; expected a directory you can write"
        )
    record_path = os.path.join(path, MANIFEST)
    if os.path.isfile(record_path):
        found = read_record(record_path, flag)
        wanted = json.loads(json.dumps(record))
        if found != wanted:
            keys = set(wanted) | set(found)  # a key on one side only (pixels) differs too
            differ = sorted(k for k in keys if found.get(k) != wanted.get(k))
            raise LatentDatasetError(
                f"{flag}={path!r} holds the {'images' if flag == '--images_dest' else 'encoding'} of "
                f"something else ({', '.join(differ)} differ from its {MANIFEST}); choose another {flag} "
                "or delete it"
            )
        return False
    if os.path.isdir(path) and os.listdir(path):
        raise LatentDatasetError(
            f"{flag}={path!r} exists, is not empty and holds no {MANIFEST}; choose another"
        )
    return True


def kept_images(files, names: Sequence[str], spec: tuple | None) -> list[str]:
    """The images ``dataset_tool.py convert`` keeps under ``spec`` = (transform, width, height):
    all but those ``center-crop-wide`` skips (decided from each header's size)."""
    if spec is None or spec[0] != "center-crop-wide":
        return list(names)
    import PIL.Image

    from dew.data.sources.latent_transforms import skips

    kept = []
    for name in names:
        with files.open(name) as fh, PIL.Image.open(fh) as image:
            width, height = image.size
        if not skips(spec[0], spec[1], spec[2], (height, width)):
            kept.append(name)
    return kept


def _checked(image: np.ndarray, shape: tuple, name: str, source: str) -> np.ndarray:
    if image.shape != tuple(shape):
        raise LatentDatasetError(
            f"--source={source!r}: {name!r} is {'x'.join(map(str, image.shape))} after decoding; "
            f"expected {'x'.join(map(str, shape))} as the first image (same-size images, or --resolution)"
        )
    return image


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dew.data.sources.latent_dataset", description=__doc__)
    parser.add_argument("--source", required=True, help="image data set: directory or .zip (NVlabs format)")
    parser.add_argument("--dest", required=True, help="output directory")
    parser.add_argument("--weights", default=None, help="sd-vae-ft-mse's diffusion_pytorch_model.safetensors")
    parser.add_argument(
        "--allow_unpinned_weights", action="store_true", help="use weights whose SHA-256 is not pinned"
    )
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_images", type=int, default=None)
    parser.add_argument(
        "--transform",
        default=None,
        help="dataset_tool.py convert's crop: center-crop, center-crop-wide or center-crop-dhariwal",
    )
    parser.add_argument(
        "--resolution", default=None, help="WxH to resize to first (dataset_tool.py convert's)"
    )
    parser.add_argument(
        "--images_dest",
        default=None,
        help="also write the encoded images there (convert's layout; latent_dataset's images)",
    )
    parser.add_argument(
        "--pixels",
        default="edm2",
        choices=("edm2", "dit", "repa"),
        help="the latent convention: edm2 encodes pixels / 255; dit and repa pixels / 127.5 - 1",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from dew.encoding.stability_vae import StabilityVAECodec
    from dew.networks.sd_vae_weights import load_weights

    try:
        if args.batch_size < 1:
            raise LatentDatasetError(f"--batch_size={args.batch_size}: expected an int >= 1")
        if args.max_images is not None and args.max_images < 1:
            raise LatentDatasetError(f"--max_images={args.max_images}: expected an int >= 1")
        from dew.data.sources.latent_transforms import make_transform, parse_resolution

        resolution = parse_resolution(args.resolution) if args.resolution else None
        make_transform(args.transform, *(resolution or (None, None)))  # bad flags stop here
        ImageFiles(args.source)  # a bad --source stops before the weights are read
        params = load_weights(args.weights, allow_unpinned=args.allow_unpinned_weights)
        codec = StabilityVAECodec(params, pixels=args.pixels)
        report = encode_dataset(
            args.source,
            args.dest,
            codec,
            batch_size=args.batch_size,
            max_images=args.max_images,
            transform=args.transform,
            resolution=resolution,
            images_dest=args.images_dest,
        )
    except (LatentDatasetError, ImageFolderError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{args.dest}: {report.total} images ({report.encoded} encoded now, {report.skipped} already there)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
