"""Load sd-vae-ft-mse's published safetensors file into the haiku VAE, digest-checked, no PyTorch.

The weights EDM2 uses are ``stabilityai/sd-vae-ft-mse`` (``training/encoders.py``:
``AutoencoderKL.from_pretrained('stabilityai/sd-vae-ft-mse')``), whose model repository
publishes ``diffusion_pytorch_model.safetensors`` (float32) and ``config.json``. A safetensors
file is an 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
``data_offsets`` per tensor) and the raw little-endian bytes: ``read_safetensors`` parses it with
NumPy (F32, F16, BF16, F64), so dew reads the published file itself, without conversion, without
PyTorch and without unpickling.

**Digest.** Neither NVlabs/edm2 nor diffusers pins a SHA-256 for this file. The model
repository's listing gives each stored file's SHA-256; for ``diffusion_pytorch_model.safetensors``
at revision ``31f26fdeee1355a5c34592e401dd41e45d25a493`` (334,643,276 bytes) that is
``a1d99348…5815`` (``PINNED_SHA256``), the value independent public projects record in their own
pin lists for this file (found by exact search, several agreeing; not recomputed here, where the
file cannot be downloaded). ``load_weights`` computes the file's SHA-256 and refuses any other
unless ``allow_unpinned=True``.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from dew import pinned_weights
from dew.pinned_weights import file_sha256 as file_sha256

SOURCE_NAME = "diffusion_pytorch_model.safetensors"
SOURCE_REPOSITORY = "stabilityai/sd-vae-ft-mse"
SOURCE_REVISION = "31f26fdeee1355a5c34592e401dd41e45d25a493"
#: SHA-256 of ``SOURCE_NAME`` at ``SOURCE_REVISION``, as its repository lists it (see above).
PINNED_SHA256: frozenset[str] = frozenset(
    {"a1d993488569e928462932c8c38a0760b874d166399b14414135bd9c42df5815"}
)
DEFAULT_PATH = os.path.join("~", ".cache", "dew", "sd-vae-ft-mse", SOURCE_NAME)
ENV_VAR = "DEW_SD_VAE_WEIGHTS"
ALLOW_UNPINNED_ENV = "DEW_SD_VAE_ALLOW_UNPINNED"

HOW_TO_GET = (
    f"download {SOURCE_NAME} from the model repository {SOURCE_REPOSITORY} (the VAE NVlabs/edm2 "
    f"uses; revision {SOURCE_REVISION}, SHA-256 {min(PINNED_SHA256)}) and put it at {DEFAULT_PATH} "
    f"(or set {ENV_VAR} to its path)"
)

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


def default_path() -> str:
    return pinned_weights.default_path(ENV_VAR, DEFAULT_PATH)


def parse_safetensors(blob: bytes | memoryview, what: str = "safetensors data") -> dict[str, np.ndarray]:
    """Every tensor of a safetensors byte string as a float32 NumPy array (BF16 widened exactly).
    Raises ``ValueError`` naming ``what`` on a malformed header or an unsupported dtype."""
    blob = memoryview(blob)
    if len(blob) < 8:
        raise ValueError(f"{what} is not a safetensors file (shorter than its 8-byte header length)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise ValueError(f"{what} is not a safetensors file (header length {header_len} exceeds the file)")
    try:
        header = json.loads(bytes(blob[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} is not a safetensors file (header is not JSON: {e})") from None
    data = blob[8 + header_len :]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(
                f"{what}: tensor {name!r} has dtype {entry.get('dtype')!r}; expected one of {sorted(_DTYPES)}"
            )
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - start != int(np.prod(shape)) * dtype.itemsize or end > len(data):
            raise ValueError(
                f"{what}: tensor {name!r} has {end - start} bytes for shape {shape} {entry['dtype']}"
            )
        a = np.frombuffer(data[start:end], dtype).reshape(shape)
        if entry["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32)
    return out


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """``parse_safetensors`` of a file."""
    with open(path, "rb") as f:
        return parse_safetensors(f.read(), what=path)


_TORCH_LEAF = {"w": "weight", "b": "bias", "scale": "weight", "offset": "bias"}


def torch_state_dict(params) -> dict[str, np.ndarray]:
    """The inverse of ``sd_vae.params_from_torch_names``: haiku params of both halves under
    diffusers' ``AutoencoderKL`` state_dict names and layouts (HWIO kernels → OIHW, [in, out]
    Linear → [out, in]), float32."""
    from dew.networks.sd_vae import torch_name

    out = {}
    for module, leaves in params.items():
        for leaf, value in leaves.items():
            a = np.asarray(value, np.float32)
            if leaf == "w":
                a = a.transpose(3, 2, 0, 1) if a.ndim == 4 else a.T
            out[f"{torch_name(module)}.{_TORCH_LEAF[leaf]}"] = a
    return out


def save_safetensors(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write float32 ``arrays`` as a safetensors file (8-byte header length, JSON header with
    ``dtype``/``shape``/``data_offsets``, then the little-endian bytes), to a temporary name
    renamed into place."""
    header, offset, blobs = {}, 0, []
    for name in sorted(arrays):
        blob = np.ascontiguousarray(arrays[name], "<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(np.shape(arrays[name])),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(tmp, path)


def load_weights(path: str | None = None, *, allow_unpinned: bool = False, config=None):
    """Haiku params of ``dew.networks.sd_vae`` (both halves; sd-vae-ft-mse's shape unless
    ``config``) from the published safetensors file (default ``$DEW_SD_VAE_WEIGHTS`` or
    ``~/.cache/dew/sd-vae-ft-mse/diffusion_pytorch_model.safetensors``).

    ``FileNotFoundError`` (one line: the file, the digest situation and how to get it) when
    missing; ``ValueError`` when the file's SHA-256 is not pinned and ``allow_unpinned`` is false,
    or when it is not an ``AutoencoderKL`` of that shape."""
    from dew.networks.sd_vae import SD_VAE, params_from_torch_names

    path = pinned_weights.existing_file(path, default_path, "sd-vae-ft-mse weights", HOW_TO_GET)
    digest = file_sha256(path)
    if digest not in PINNED_SHA256 and not allow_unpinned:
        pinned = ", ".join(sorted(PINNED_SHA256)) or "none is pinned"
        raise ValueError(
            f"VAE weights {path} have SHA-256 {digest}, which is not pinned ({pinned}); pass "
            f"allow_unpinned=True (or set {ALLOW_UNPINNED_ENV}=1) to use them anyway"
        )
    return params_from_torch_names(read_safetensors(path), config or SD_VAE)


__all__ = [
    "HOW_TO_GET",
    "PINNED_SHA256",
    "SOURCE_NAME",
    "default_path",
    "load_weights",
    "parse_safetensors",
    "read_safetensors",
    "save_safetensors",
    "torch_state_dict",
]
