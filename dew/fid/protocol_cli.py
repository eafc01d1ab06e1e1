"""The names this module held before ``python -m dew.fid`` took one road (``dew.fid.cli`` reads
every flag, ``dew.fid.protocol`` runs ``--preset`` and ``ref``), kept so their imports resolve:
``_detector`` takes the flags (``dew.fid.cli.protocol_args``) as it did."""

import argparse
from typing import Any

from dew.fid.cli import protocol_args as _protocol_args


def _detector(args: argparse.Namespace) -> Any:
    """``dew.fid.protocol``'s detector of ``--weights`` at ``--image_handling`` of ``args``."""
    from dew.fid.protocol import protocol_run

    return protocol_run(args).weights.detector()


__all__ = ["_detector", "_protocol_args"]
