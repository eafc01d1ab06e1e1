"""FID and its kin (KID, FD_DINOv2) from the command line: ``python -m dew.fid`` (``cli``), the
paper's protocol and reference statistics (``protocol_cli``), their shared inputs (``inputs``)."""

from dew.fid.cli import main

__all__ = ["main"]
