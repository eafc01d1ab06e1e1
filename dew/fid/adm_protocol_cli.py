"""The name this module held before ``python -m dew.fid --preset`` ran FID and ADM's suite as one
mode (``dew.fid.protocol``), kept so its import resolves: ``_scorer_and_detector`` takes the
``--preset`` flags (``dew.fid.cli.protocol_args``) as it did."""

import argparse
from typing import Any


def _scorer_and_detector(args: argparse.Namespace) -> tuple[Any, Any]:
    """ADM's scorer and the protocol's detector (``Weights.adm_scorer_and_detector``) on the
    weights and ``--batch`` of ``args``."""
    from dew.fid.protocol import protocol_run

    return protocol_run(args).weights.adm_scorer_and_detector(args.batch)


__all__ = ["_scorer_and_detector"]
