"""Per-item checksums, written after an item's data and verified before it is read.

Each item directory of a persistent step (``<step>/params``, ``<step>/opt_state``, ...) gets a
``dew_checksums.json`` after its data is final and before the step is renamed into place (the
store's ``ChecksummedPyTreeHandler`` writes it in orbax's ``finalize``; the local tier writes
it into its temporary directory): the size and SHA-256 of every file under the item, computed
by reading the files back (so it vouches for what is on disk, not for what was meant to be
written). A step that is visible is therefore checksummed. ``verify_item`` streams the files
again, one MiB at a time, on the host that is about to read them, and raises
``CheckpointDamagedError`` naming the step, the item and the first file that is missing,
shorter or longer than written, or whose bytes changed. A step flagged as checksummed whose
checksums are missing is incomplete (written by a dew that checksummed after the rename and
was killed in between, or damaged since): ``verify_item`` says so. Steps from before checksums
were written carry no ``checksummed`` flag in their metadata and are read unverified.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import orbax.checkpoint as ocp
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


def _read_checksums(text: str) -> dict[str, dict[str, Any]]:
    """The ``files`` of a checksums record, checked against the shape ``write_checksums`` gives
    (``{"files": {relative path: {"size": int >= 0, "sha256": 64 hex digits}}}``); anything else
    raises ``ValueError`` saying what was found."""
    record = json.loads(text)
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        found = f"files {_shape(record.get('files'))}" if isinstance(record, dict) else _shape(record)
        raise ValueError(f'expected {{"files": {{path: {{"size": int, "sha256": hex}}}}}}, found {found}')
    for name, entry in record["files"].items():
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith("/") or ".." in parts:
            raise ValueError(f"file name {name!r} is not a path inside the item")
        if (
            not isinstance(entry, dict)
            or not _is_int(entry.get("size"))
            or entry["size"] < 0
            or not isinstance(entry.get("sha256"), str)
            or len(entry["sha256"]) != 64
            or any(c not in "0123456789abcdef" for c in entry["sha256"])
        ):
            expected = '{"size": int >= 0, "sha256": 64 hex digits}'
            raise ValueError(f"file {name!r}: expected {expected}, found {entry!r:.200}")
    return record["files"]


def _shape(value: object) -> str:
    return "null" if value is None else type(value).__name__


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
        files = _read_checksums(record_path.read_text())
    except (ValueError, RecursionError) as e:
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


class ChecksummedPyTreeHandler(ocp.PyTreeCheckpointHandler):
    """The persistent tier's orbax handler (``store`` registers it for every item through
    orbax's ``handler_registry``): orbax's pytree handler, whose ``finalize`` also writes the
    item's ``dew_checksums.json``.

    Orbax calls ``finalize`` on the primary process, after every process has written its part
    and before the item and then the step are renamed into place; so the checksums are inside
    the step before it becomes visible, and a kill at any moment leaves either a complete,
    checksummed step or none."""

    def finalize(self, directory: epath.Path) -> None:
        super().finalize(directory)  # merges the per-process files into the final ones
        write_checksums(directory)

    @classmethod
    def typestr(cls) -> str:
        """The name orbax records for each item's handler in a step's metadata
        (``item_handlers``): the one checkpoints have carried since their items were
        checksummed, when the handler had a module of its own, so the format stays as it was."""
        return "dew.checkpointing.checksummed_handler.ChecksummedPyTreeHandler"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
