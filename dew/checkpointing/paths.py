"""Checkpoint directories: a local path or a URI, through orbax's own path type (``etils.epath``).

``directory("runs/a/checkpoints")`` and ``directory("file:///abs/runs/a/checkpoints")`` name the
same local directory; ``directory("gs://bucket/run")`` is a remote one, usable only when the
filesystem package for that scheme is installed. Nothing is opened or created here: the checks
are on the text and on which packages are importable, so a wrong URI fails when a config is
read, never by writing somewhere else (``./gs:/bucket/run``).
"""

from __future__ import annotations

import importlib.util
import os
import urllib.parse

from etils import epath

#: Remote schemes etils.epath serves, and the packages that can back each (any one will do:
#: etils uses TensorFlow's gfile when TensorFlow is installed, else fsspec's implementation).
REMOTE_SCHEMES: dict[str, tuple[str, ...]] = {
    "gs": ("gcsfs", "tensorflow"),
    "s3": ("s3fs", "tensorflow"),
    "az": ("adlfs", "tensorflow"),
    "hf": ("huggingface_hub",),
}


class DirectoryError(ValueError):
    """A checkpoint directory that cannot be used as given (bad URI, missing filesystem)."""


def scheme_of(text: str) -> str | None:
    """The URI scheme of ``text`` (``"gs"``), or None for a plain path."""
    if "://" not in text:
        return None
    return text.split("://", 1)[0].lower()


def directory(text: str | os.PathLike, what: str = "checkpoint directory") -> epath.Path:
    """``text`` as an ``epath.Path``: a plain path made absolute, ``file://`` as the local path
    it names, a remote URI as is when its filesystem package is installed.

    Raises ``DirectoryError`` naming the value, the scheme and what would be accepted.
    """
    raw = os.fspath(text)
    if not isinstance(raw, str) or not raw:
        raise DirectoryError(f"{what} {text!r} is invalid: expected a non-empty path or URI")
    scheme = scheme_of(raw)
    if scheme is None:
        return epath.Path(os.path.abspath(raw))
    if scheme == "file":
        parsed = urllib.parse.urlparse(raw)
        if parsed.netloc not in ("", "localhost"):
            raise DirectoryError(
                f"{what} {raw!r} names host {parsed.netloc!r}: a file:// URI must be file:///absolute/path"
            )
        return epath.Path(os.path.abspath(urllib.parse.unquote(parsed.path)))
    if scheme not in REMOTE_SCHEMES:
        known = ", ".join(f"{s}://" for s in ("file", *REMOTE_SCHEMES))
        raise DirectoryError(
            f"{what} {raw!r} has the URI scheme {scheme}://, which orbax's path handling (etils.epath) "
            f"does not serve: expected a local path or one of {known}"
        )
    packages = REMOTE_SCHEMES[scheme]
    if not any(importlib.util.find_spec(p) is not None for p in packages):
        raise DirectoryError(
            f"{what} {raw!r} is on {scheme}://, whose filesystem package is not installed: "
            f"install {' or '.join(packages)} to use it (nothing was written)"
        )
    return epath.Path(raw)


def is_local(path: epath.Path) -> bool:
    """Whether ``path`` is on this machine's file system (``os`` functions work on it)."""
    return scheme_of(os.fspath(path)) is None
