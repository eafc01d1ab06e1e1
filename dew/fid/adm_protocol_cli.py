"""The name this module held before ``python -m dew.fid --preset`` ran FID and ADM's suite as one
mode (``dew.fid.protocol``), kept so its import resolves."""

from dew.fid.protocol import scorer_and_detector as _scorer_and_detector

__all__ = ["_scorer_and_detector"]
