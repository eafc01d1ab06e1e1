"""FID and its kin (KID, FD_DINOv2, ADM's suite) from the command line: ``python -m dew.fid``.
``cli`` parses and checks every flag and hands each mode to its one function: ``reference``
(``ref``: a data set's reference statistics), ``protocol`` (``--preset``: the paper's protocol),
``adm`` (ADM's suite of a folder or a run's samples) and ``score`` (FID, FD_DINOv2, KID of a
folder or a run's samples); ``inputs`` is what every mode shares. The work they share (reading
images, embedding them, scoring ``FeatureSet``s) is ``dew.scoring``'s."""

from dew.fid.cli import main

__all__ = ["main"]
