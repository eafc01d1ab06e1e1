"""Write ``tests/data/averages_checkpoint_87d5f86``: a checkpoint with both averages, by the code
of commit 87d5f86 (before ``dew.averaging.averager``), to prove the new layout rule reads it.

Run from a checkout of that commit:  PYTHONPATH=. python <this file> <output directory>
The state is the one ``helpers_averaging.tiny_run(accumulation=2, power=True, steps=4)`` reaches
(4 steps, 2 updates).
"""

import sys

import jax

sys.path.insert(0, __file__.rsplit("/", 2)[0])  # tests/, for test_averaging's tiny run
from helpers_averaging import tiny_run

from dew.checkpointing import Checkpoints

state = tiny_run(accumulation=2, power=True, steps=4)
ckpt = Checkpoints(sys.argv[1], keep=None)
ckpt.save(4, jax.device_get(state), None)
ckpt.close()
