"""A registered data set's split, opened by the name ``config.dataset`` gives it: what the
trainer, the objectives that keep held-out examples (autoencoder, language, contrastive) and the
entry points share, below all of them. ``dew.training.build`` re-exports ``open_split``."""

from __future__ import annotations

import json
from typing import Any

import ml_collections

from dew import registry
from dew.schema import ConfigError

#: A split opened ahead (``open_split(..., keep=True)``: the checks before the platform starts),
#: handed to the next ``open_split`` of the same data set and split, the Trainer's: a data set
#: is read once (an image folder decodes every image when it opens).
_KEPT: dict[str, Any] = {}


def open_split(section: ml_collections.ConfigDict, split: str, *, keep: bool = False) -> Any:
    """The ``split`` of the registered source ``config.dataset`` names, with its options; a
    source that cannot be opened is a ``ConfigError`` naming the data set. ``keep``: also hand
    it to the next call for the same section and split (one at a time)."""
    key = json.dumps([section.to_dict(), split], sort_keys=True, default=repr)
    if key in _KEPT:
        return _KEPT.pop(key)
    source = _open(section, split)
    if keep:
        _KEPT.clear()
        _KEPT[key] = source
    return source


def _open(section: ml_collections.ConfigDict, split: str) -> Any:
    options = {k: v for k, v in section.items() if k not in ("name", "batch_size")}
    try:
        return registry.datasets[section.name](split, **options)
    except ConfigError:
        raise
    except (ValueError, KeyError, OSError, TypeError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ConfigError(
            f"config.dataset.name={section.name!r}: cannot open its {split!r} split "
            f"({type(e).__name__}: {message})"
        ) from None


__all__ = ["open_split"]
