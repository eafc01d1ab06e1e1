"""The run-once ``init`` program is compiled without LLVM optimisation (compile time is a user's
wait); its result must not depend on that choice."""

from __future__ import annotations

from typing import cast

import jax
import numpy as np
from helpers_common import tiny_config
from jax.stages import Wrapped

from dew.training.sharding import INIT_COMPILER_OPTIONS
from dew.training.trainer import Trainer


def test_init_compiled_for_speed_of_compile_gives_the_same_bits(tmp_path):
    config = tiny_config(**{"model.channel_mult": (1,), "model.attn_resolutions": ()})
    trainer = Trainer(config, str(tmp_path / "run"))
    key, batch = jax.random.PRNGKey(3), trainer.example_batch()
    # Programs types its jitted programs as plain callables; they are jax's jitted functions
    lowered = cast(Wrapped, trainer.programs.init).lower(key, batch)
    assert INIT_COMPILER_OPTIONS == {"xla_backend_optimization_level": 0}
    fast = jax.tree.leaves(trainer.programs.init(key, batch))  # what the Trainer runs
    # jax types compiler options as str | bool values; XLA's optimisation level is an int, as in
    # INIT_COMPILER_OPTIONS, which jax passes on as it is
    level_3 = cast("dict[str, str | bool]", {"xla_backend_optimization_level": 3})
    optimised = jax.tree.leaves(lowered.compile(level_3)(key, batch))
    assert len(fast) == len(optimised) > 10
    for a, b in zip(fast, optimised, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
