"""The name this module held before ``python -m dew.fid --preset`` ran FID and ADM's suite as one
mode (``dew.fid.protocol``), kept so its import resolves: ``_scorer_and_detector`` takes the
``--preset`` flags (``dew.fid.cli.protocol_args``) as it did."""

import argparse
from typing import Any


def _scorer_and_detector(args: argparse.Namespace) -> tuple[Any, Any]:
    """ADM's scorer (``dew.scoring.adm_metrics.weights_scorer``) and the protocol's detector over
    the weights it read (``AdmScorer.protocol_detector``) on the weights and ``--batch`` of
    ``args``."""
    from dew.fid.protocol import protocol_run
    from dew.scoring.adm_metrics import weights_scorer

    weights = protocol_run(args).weights
    scorer = weights_scorer(weights.path, pinned=weights.pinned, batch=args.batch, flag=weights.flag)
    return scorer, scorer.protocol_detector()


__all__ = ["_scorer_and_detector"]
