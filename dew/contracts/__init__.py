"""The contracts every layer above the core shares: ``TrainState`` (``dew.contracts.state``),
the value threaded through training and all a checkpoint holds, ``Objective``, ``Step`` and
``Aux`` (``dew.contracts.objective``), what the trainer knows about what is learned, and the
compute dtype an objective calls its network in (``dew.contracts.precision``).

They sit below the trainer and checkpointing alike, so neither imports the other to name them.
The seed's spellings keep working: ``dew.training.state`` and ``dew.training.objective`` (and
``dew.objectives.base``) re-export them, and ``dew`` / ``dew.training`` export the names.
"""
