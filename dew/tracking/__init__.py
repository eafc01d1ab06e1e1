"""Tracker backends, one module each: ``base`` (the contract and the fan-out), ``background``
(the queue slow backends write through), ``process`` (that worker in a process of its own),
``local``, ``tensorboard``, ``mlflow``, ``wandb``, and ``media`` (artifacts as PNG/GIF/text).

Importing this package, or any module in it, imports no backend library: each backend is
imported by its tracker's worker (a process, by default) when the first report is written. The public names
are re-exported by ``dew.tracking.trackers`` and ``dew.training``.
"""
