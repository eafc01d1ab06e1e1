"""The name this module held before ``python -m dew.fid --preset`` ran FID and ADM's suite as one
mode (``dew.fid.protocol``), kept so its import resolves: ``_scorer_and_detector``, defined with
the other old protocol names in ``dew.fid.protocol_cli``."""

from dew.fid.protocol_cli import _scorer_and_detector

__all__ = ["_scorer_and_detector"]
