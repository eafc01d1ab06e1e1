"""FID and its kin (KID, FD_DINOv2, ADM's suite) from the command line: ``python -m dew.fid``.
``cli`` reads every flag and hands each mode to one function: ``score`` (a folder of images or a
run's samples), ``protocol`` (the paper's protocol and reference statistics); ``inputs`` is what
they share."""

from dew.fid.cli import main

__all__ = ["main"]
