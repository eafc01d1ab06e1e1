"""Readers for what the trackers write, each backend's own where it ships one.

W&B 0.31 ships no Python reader for its run file (the old ``datastore`` module moved into the
Go core), so ``wandb_history`` walks the file's documented framing (a 7-byte ``:W&B`` header,
then LevelDB-log records: 32 KiB blocks, each record a CRC-32, a length and a FULL/FIRST/MIDDLE/
LAST type) with every CRC checked, and parses each record with W&B's own protobuf schema
(``wandb.proto.wandb_internal_pb2.Record``).
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zlib
from typing import Any

_BLOCK = 32768
_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version 0
_RECORD = struct.Struct("<IHB")  # crc32(type byte + data), length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: str) -> list[Any]:
    """Every record of a ``run-<id>.wandb`` file, as ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    ident, magic, version = _HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, pending, records = _HEADER.size, b"", []
    while pos + _RECORD.size <= len(data):
        if _BLOCK - pos % _BLOCK < _RECORD.size:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = _RECORD.unpack_from(data, pos)
        if kind == 0 and length == 0:
            break
        chunk = data[pos + _RECORD.size : pos + _RECORD.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"bad CRC at byte {pos}"
        pos += _RECORD.size + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
    # wandb builds its protobuf classes when the module is imported: no stub declares Record
    record_class: Any = vars(wandb_internal_pb2)["Record"]
    parsed = []
    for raw in records:
        record = record_class()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def wandb_history(run_dir: str) -> list[dict[str, Any]]:
    """The history rows of an offline run directory, values decoded from JSON."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def offline_run_dirs(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "wandb", "offline-run-*")))


def event_accumulator(directory: str) -> Any:
    """TensorBoard's own reader over an event directory, keeping every event."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    sizes = {ea.SCALARS: 0, ea.IMAGES: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0}
    accumulator = ea.EventAccumulator(directory, size_guidance=sizes)
    accumulator.Reload()
    return accumulator
