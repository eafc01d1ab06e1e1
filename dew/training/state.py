"""``TrainState``: the one value threaded through training, and all a resume needs.

Defined in the contracts package (``dew.contracts.state``), below the trainer and checkpointing
alike; the trainer's spelling, documented here, names the same class.
"""

from dew.contracts.state import Params, TrainState, num_updates

__all__ = ["Params", "TrainState", "num_updates"]
