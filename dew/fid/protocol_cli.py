"""The names this module held before ``python -m dew.fid`` took one road (``dew.fid.cli`` reads
every flag, ``dew.fid.protocol`` runs ``--preset`` and ``ref``), kept so their imports resolve."""

from dew.fid.cli import protocol_args as _protocol_args
from dew.fid.protocol import _detector

__all__ = ["_detector", "_protocol_args"]
