"""The names this module held before ``python -m dew.fid`` took one road (``dew.fid.cli`` reads
every flag, ``dew.fid.protocol`` runs ``--preset`` and ``ref``), kept so their imports resolve:
``_detector`` takes the flags (``dew.fid.cli.protocol_args``) as it did."""

import argparse
from typing import Any

from dew.fid.cli import protocol_args as _protocol_args


def _detector(args: argparse.Namespace) -> Any:
    """``dew.fid.protocol``'s detector of ``--weights`` at ``--image_handling`` of ``args``
    (``dew.scoring.fid_reference.weights_detector``)."""
    from dew.fid.protocol import protocol_run
    from dew.scoring.fid_reference import weights_detector

    weights = protocol_run(args).weights
    return weights_detector(weights.path, pinned=weights.pinned, handling=weights.handling)


__all__ = ["_detector", "_protocol_args"]
