"""The names ``dew.fid.protocol_cli`` and ``dew.fid.adm_protocol_cli`` held before ``python -m
dew.fid`` took one road (``dew.fid.cli`` reads every flag, ``dew.fid.protocol`` runs ``--preset``
for FID and ADM's suite alike), kept so their imports resolve; each takes the ``--preset`` flags
(``dew.fid.cli.protocol_args``) as it did. ``adm_protocol_cli`` re-exports its one name from here."""

import argparse
from typing import Any

from dew.fid.cli import protocol_args as _protocol_args
from dew.fid.protocol import protocol_run


def _detector(args: argparse.Namespace) -> Any:
    """``dew.fid.protocol``'s detector of ``--weights`` at ``--image_handling`` of ``args``
    (``dew.scoring.fid_detector.weights_detector``)."""
    from dew.scoring.fid_detector import weights_detector

    weights = protocol_run(args).weights
    return weights_detector(weights.path, pinned=weights.pinned, handling=weights.handling)


def _scorer_and_detector(args: argparse.Namespace) -> tuple[Any, Any]:
    """ADM's scorer (``dew.scoring.adm_metrics.weights_scorer``) and the protocol's detector over
    the weights it read (``dew.scoring.fid_detector.adm_detector``) on the weights and ``--batch``
    of ``args``."""
    from dew.scoring.adm_metrics import weights_scorer
    from dew.scoring.fid_detector import adm_detector

    weights = protocol_run(args).weights
    scorer = weights_scorer(weights.path, pinned=weights.pinned, batch=args.batch, flag=weights.flag)
    return scorer, adm_detector(scorer.params, scorer.digest)


__all__ = ["_detector", "_protocol_args", "_scorer_and_detector"]
