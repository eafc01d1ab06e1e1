"""The persistent tier's orbax handler: orbax's pytree handler that checksums each item as it lands.

Kept apart from ``integrity`` (which the local tier uses without orbax) and from ``store`` (which
registers it for every item through orbax's ``handler_registry``).
"""

from __future__ import annotations

import orbax.checkpoint as ocp
from etils import epath

from dew.checkpointing.integrity import write_checksums


class ChecksummedPyTreeHandler(ocp.PyTreeCheckpointHandler):
    """Orbax's pytree handler, whose ``finalize`` also writes the item's ``dew_checksums.json``.

    Orbax calls ``finalize`` on the primary process, after every process has written its part
    and before the item and then the step are renamed into place; so the checksums are inside
    the step before it becomes visible, and a kill at any moment leaves either a complete,
    checksummed step or none."""

    def finalize(self, directory: epath.Path) -> None:
        super().finalize(directory)  # merges the per-process files into the final ones
        write_checksums(directory)
