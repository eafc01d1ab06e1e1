"""On an accelerator ``dew.runtime.start`` runs none of the CPU's set-up (nothing of
``dew.runtime.cpu``: no host device split, no glibc tuning, no kernel choice, no malloc
restart), keeps the compilation cache, picks the TPU's flash attention, and its lines name the
devices. Driven on this CPU machine by telling the platform module that the backend will not be
the CPU."""

from __future__ import annotations

import pytest

from dew import kernels
from dew.runtime import backend, platform
from dew.runtime.cpu import choice, devices, flags, setup
from dew.runtime.cpu import memory as host_memory


@pytest.fixture
def accelerator(monkeypatch, tmp_path):
    """``start`` as on a TPU: every CPU-only entry point fails the test if it is reached."""

    def reached(*args, **kwargs):
        raise AssertionError("a CPU-only set-up step ran on an accelerator")

    monkeypatch.setattr(backend, "cpu_backend_expected", lambda environ=None: False)
    monkeypatch.setattr(backend, "expected_platform", lambda environ=None: "tpu")
    monkeypatch.setattr(setup, "set_up", reached)  # the one entry into the CPU platform
    monkeypatch.setattr(devices, "present_host_devices", reached)
    monkeypatch.setattr(host_memory, "reuse_freed_memory", reached)
    monkeypatch.setattr(choice, "choose", reached)
    monkeypatch.setattr(flags, "route_convolutions", reached)
    monkeypatch.setattr(platform.compilation_cache, "enable_compilation_cache", lambda directory: None)
    monkeypatch.setattr(platform.distributed, "requested", lambda **kwargs: None)
    monkeypatch.setenv("DEW_CACHE_DIR", str(tmp_path))
    previous = kernels.current()
    yield
    kernels.set_choice(previous)
    monkeypatch.setattr(platform, "_started", None)


def test_start_on_an_accelerator_runs_nothing_of_the_cpus_and_takes_the_attention_asked(accelerator):
    import ml_collections

    config = ml_collections.ConfigDict({"runtime": dict(platform._DEFAULTS, attention="flash")})
    started = platform.start(config)
    assert started.cpu is False and started.host_devices is None and started.decision is None
    assert started.compilation_cache is not None  # compiled programs are kept on accelerators too
    assert kernels.current().attention == "tpu_flash"
    assert started.kernels.attention == "tpu_flash"


def test_the_malloc_restart_is_skipped_where_the_backend_is_not_the_cpu(monkeypatch):
    monkeypatch.setattr(backend, "cpu_backend_expected", lambda environ=None: False)
    monkeypatch.setattr(host_memory, "kept_heap_environment", lambda environ: {"GLIBC_TUNABLES": "x"})

    def restarted(*args):
        raise AssertionError("restarted for the CPU's malloc tunables on an accelerator")

    monkeypatch.setattr(host_memory.os, "execve", restarted)
    host_memory.with_kept_heap()  # returns: no restart


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"JAX_PLATFORMS": "cpu"}, "cpu"),
        ({"JAX_PLATFORMS": "tpu,cpu"}, "tpu"),
        ({"JAX_PLATFORMS": "cuda"}, "gpu"),
        ({"JAX_PLATFORM_NAME": "rocm"}, "gpu"),
    ],
)
def test_the_expected_platform_reads_jax_platforms_first(environ, expected):
    assert backend.expected_platform(environ) == expected


def test_attention_choice_is_flash_only_on_a_tpu():
    cpu = {"JAX_PLATFORMS": "cpu"}
    assert platform.attention_choice("auto", cpu) == "xla"
    assert platform.attention_choice("xla", {"JAX_PLATFORMS": "tpu"}) == "xla"
    assert platform.attention_choice("auto", {"JAX_PLATFORMS": "tpu"}) == "xla"  # measured faster
    assert platform.attention_choice("flash", {"JAX_PLATFORMS": "tpu"}) == "tpu_flash"
    assert platform.attention_choice("xla_float32_logits", cpu) == "xla_float32_logits"
    with pytest.raises(ValueError, match=r"config\.runtime\.attention='flash' is invalid here.*'cpu'"):
        platform.attention_choice("flash", cpu)


def test_attention_off_a_tpu_or_on_an_untiled_sequence_is_xlas():
    import jax
    import jax.numpy as jnp
    import numpy as np

    q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 16, 2, 8)), jnp.float32)
    with kernels.using(kernels.KernelChoice(attention="tpu_flash")):  # 16 tokens: not whole blocks
        got = kernels.attention(q, q, q)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.nn.dot_product_attention(q, q, q)))
