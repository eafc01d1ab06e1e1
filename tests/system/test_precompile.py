"""The run compiles its step while the state is built, and the step's first call uses that
program: one lowering and one compile of the step per run, both in the background thread."""

from __future__ import annotations

import logging
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers_common import tiny_config

from dew.runtime.precompile import BackgroundCompile, abstract_like
from dew.training.trainer import Trainer


class CompileLog(logging.Handler):
    """JAX's compile log lines (``jax_log_compiles``), with the threads that wrote them."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.threadName, record.getMessage()))

    def lowerings(self, program: str) -> list[tuple[str, str]]:
        return [(t, line) for t, line in self.lines if f"conversion {program} in" in line]


@pytest.fixture
def compile_log():
    handler = CompileLog()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    previous = jax.config.values["jax_log_compiles"]
    jax.config.update("jax_log_compiles", True)
    yield handler
    jax.config.update("jax_log_compiles", previous)
    logger.removeHandler(handler)


@pytest.mark.parametrize(
    ("steps_per_call", "prefetch", "program"),
    [(1, 0, "jit(step)"), (2, 0, "jit(multi)"), (1, 2, "jit(step)")],  # prefetch: batches placed ahead
)
def test_the_step_is_lowered_once_in_the_background_and_its_first_call_reuses_it(
    tmp_path, compile_log, steps_per_call, prefetch, program
):
    config = tiny_config(
        **{
            "train.steps_per_call": steps_per_call,
            "eval.every": 0,
            "preview.every": 0,
            "checkpoint.every": 6,
            "checkpoint.keep_best": False,
        }
    )
    trainer = Trainer(config, str(tmp_path / "run"))
    trainer.train_data.prefetch = prefetch
    state = trainer.run()
    assert int(state.step) == 6
    # A second lowering would mean the first call missed the program compiled for it (other
    # shapes or shardings than the call's) and compiled it again, in the caller's thread. (With
    # 2 steps per call every cadence here is even: the single step is never called.)
    lowered = compile_log.lowerings(program)
    assert len(lowered) == 1 and lowered[0][0] == "dew-precompile", lowered
    assert not compile_log.lowerings("jit(step)" if steps_per_call > 1 else "jit(multi)")


def test_wait_leaves_the_compiled_program_which_computes_what_the_jitted_function_does():
    program = jax.jit(lambda x: (x * 3.0).sum())
    x = np.arange(6, dtype=np.float32)
    compiling = BackgroundCompile(program, jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert compiling.compiled is None or isinstance(compiling.compiled, jax.stages.Compiled)
    compiling.wait()
    assert isinstance(compiling.compiled, jax.stages.Compiled)
    assert float(compiling.compiled(x)) == float(program(x)) == 45.0  # small integers: exact


def test_an_error_while_compiling_is_raised_by_wait_in_the_callers_thread():
    reshape = jax.jit(lambda x: x.reshape(3))
    compiling = BackgroundCompile(reshape, jax.ShapeDtypeStruct((2,), np.float32))
    with pytest.raises(TypeError, match="reshape"):
        compiling.wait()
    compiling.wait()  # raised once; the thread is done


def test_abstract_like_keeps_shapes_dtypes_and_the_given_shardings():
    tree = {"a": np.zeros((2, 3), np.float32), "b": np.zeros((), np.int32)}
    plain = abstract_like(tree)
    assert plain["a"].shape == (2, 3) and plain["b"].dtype == np.int32 and plain["a"].sharding is None
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert all(leaf.sharding == one for leaf in jax.tree.leaves(abstract_like(tree, one)))
    per_leaf = abstract_like(tree, {"a": one, "b": None})
    assert per_leaf["a"].sharding == one and per_leaf["b"].sharding is None


EXIT_WHILE_COMPILING = """
import sys
import jax, jax.numpy as jnp
from dew.runtime.precompile import BackgroundCompile

def program(x):
    for i in range(60):
        x = jnp.sin(x @ x.T + i)
    return x

BackgroundCompile(jax.jit(program), jax.ShapeDtypeStruct((64, 64), jnp.float32))
sys.exit(2)  # a run that fails (say, a checkpoint that does not fit) while the step compiles
"""


def test_a_process_that_exits_while_the_step_compiles_exits_with_its_own_status():
    # With a daemon thread this aborted (status -6: "terminate called ... exception not
    # rethrown") whenever the compile outlived the interpreter's finalisation.
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", EXIT_WHILE_COMPILING], capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert "terminate called" not in result.stderr
