"""Tracker backends, one module each: ``base`` (the contract and the fan-out), ``background``
(the worker-thread queue slow backends write through), ``local``, ``tensorboard``, ``mlflow``,
``wandb``, and ``media`` (artifacts as PNG/GIF/text).

Importing this package, or any module in it, imports no backend library: each backend is
imported on its tracker's worker thread when the first report is written. The public names
are re-exported by ``dew.training.trackers`` and ``dew.training``.
"""
