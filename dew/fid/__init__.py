"""FID and its kin (KID, FD_DINOv2, ADM's suite) from the command line: ``python -m dew.fid``.
``cli`` parses every flag, ``settings`` (``settings_of``) checks each mode's and turns them into
what its function takes, and each mode is one function: ``score`` (a folder of images or a run's samples),
``protocol`` (the paper's protocol and reference statistics); ``inputs`` is what every mode
shares. The work they share (reading images, embedding them, scoring ``FeatureSet``s) is
``dew.scoring``'s."""

from dew.fid.cli import main

__all__ = ["main"]
