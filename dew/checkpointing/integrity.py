"""Checksums for checkpoint items: written after an item's data, verified before it is read.

Each item directory of a persistent step (``<step>/params``, ``<step>/opt_state``, ...) gets a
``dew_checksums.json`` after its data is final and before the step is renamed into place (the
store's handler writes it in orbax's ``finalize``; the local tier writes it into its temporary
directory): the size and SHA-256 of every file under the item, computed by reading the files
back (so it vouches for what is on disk, not for what was meant to be written). A step that
is visible is therefore checksummed. ``verify_item`` streams the files again, one MiB at a time,
on the host that is about to read them, and raises ``CheckpointDamagedError`` naming the step,
the item and the first file that is missing, shorter or longer than written, or whose bytes
changed.

A step flagged as checksummed whose checksums are missing is incomplete (written by a dew that
checksummed after the rename and was killed in between, or damaged since): ``verify_item`` says
so. Steps from before checksums were written carry no ``checksummed`` flag in their metadata and
are read unverified.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from etils import epath

from dew.checkpointing.errors import CheckpointDamagedError

CHECKSUMS = "dew_checksums.json"
_CHUNK = 1 << 20


def _files(item_dir: epath.Path) -> list[epath.Path]:
    """Every file under ``item_dir`` but the checksums (a walk by ``iterdir``: epath refuses
    recursive globs, which would be thousands of requests on object stores)."""
    out, pending = [], [item_dir]
    while pending:
        for path in pending.pop().iterdir():
            if path.is_dir():
                pending.append(path)
            elif path.name != CHECKSUMS and not path.name.startswith(f".{CHECKSUMS}"):
                out.append(path)
    return sorted(out, key=str)


def digest(path: epath.Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, streamed."""
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def write_checksums(item_dir: epath.Path) -> dict[str, Any]:
    """Hash every file under ``item_dir`` and write ``dew_checksums.json`` there (write to a
    temporary name, then rename, so a reader sees all of it or none)."""
    item_dir = epath.Path(item_dir)
    files = {}
    for path in _files(item_dir):
        size, sha = digest(path)
        files[str(path.relative_to(item_dir))] = {"size": size, "sha256": sha}
    record = {"algorithm": "sha256", "files": files}
    tmp = item_dir / f".{CHECKSUMS}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.rename(item_dir / CHECKSUMS)
    return record


def verify_item(step: int, item: str, item_dir: epath.Path) -> None:
    """Check every file ``dew_checksums.json`` lists under ``item_dir``; raise
    ``CheckpointDamagedError`` naming ``step``, ``item`` and the file at the first mismatch."""
    item_dir = epath.Path(item_dir)
    where = f"checkpoint step {step} is damaged: item {item!r}"
    record_path = item_dir / CHECKSUMS
    if not item_dir.exists():
        raise CheckpointDamagedError(
            f"{where} is missing ({item_dir})", step=step, item=item, path=str(item_dir)
        )
    if not record_path.exists():
        raise CheckpointDamagedError(
            f"{where} is incomplete: its checksums ({record_path}) never landed",
            step=step,
            item=item,
            path=str(record_path),
        )
    try:
        files = json.loads(record_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointDamagedError(
            f"{where}: its checksums {record_path} are unreadable ({e})",
            step=step,
            item=item,
            path=str(record_path),
        ) from None
    for name, expected in sorted(files.items()):
        path = item_dir / name
        if not path.exists():
            raise CheckpointDamagedError(
                f"{where}, file {path} is missing", step=step, item=item, path=str(path)
            )
        size, sha = digest(path)
        if size != expected["size"]:
            raise CheckpointDamagedError(
                f"{where}, file {path} holds {size} bytes, {expected['size']} were written",
                step=step,
                item=item,
                path=str(path),
            )
        if sha != expected["sha256"]:
            raise CheckpointDamagedError(
                f"{where}, file {path} does not match its checksum (its bytes changed after it was written)",
                step=step,
                item=item,
                path=str(path),
            )
