"""dew's version: one literal, read by ``dew.__version__`` and by the run records (``run.json``
names the version that started each run) without importing the package's export table."""

from __future__ import annotations

__version__ = "0.1.0"
