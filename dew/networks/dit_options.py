"""The DiT family's sizes and the options ``dew.networks.dit.DiT`` is built with: what each
accepts, checked at config time (``check_options``: one ``ConfigError`` line naming the field,
the value and what is accepted) before anything is traced or written."""

from __future__ import annotations

from collections.abc import Sequence

from dew.networks.remat import REMAT_POLICIES
from dew.schema import ConfigError

SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
"""size -> (depth, hidden_size, num_heads), the references' ``DiT_models`` / ``SiT_models``."""

PATCH_SIZES = (2, 4, 8)
TIME_INPUTS = (("t",), ("t", "h"))
CONDITIONINGS = ("adaln", "in_context")
IMF_SIZES = {"B": (12, 768, 12), "M": (24, 768, 12), "L": (32, 1024, 16), "XL": (48, 1024, 16)}
"""size -> (depth, hidden_size, num_heads), imfDiT_B_2 … imfDiT_XL_2 (patch 2, aux_head_depth 8)."""
NORMS = ("layernorm", "rmsnorm")
TIME_DIRECTIONS = ("sit", "repa")
MLPS = ("gelu_tanh", "swiglu")


def _fail(field: str, value: object, accepted: str) -> ConfigError:
    return ConfigError(f"DiT: {field}={value!r} is invalid: expected {accepted}")


def check_options(
    *,
    depth: int,
    hidden_size: int,
    num_heads: int,
    patch_size: int,
    class_dropout_prob: float = 0.1,
    input_size: int | None = None,
    time_inputs: Sequence[str] = ("t",),
    encoder_depth: int | None = None,
    projector_dims: Sequence[int] = (),
    norm: str = "layernorm",
    mlp: str = "gelu_tanh",
    rotary: bool = False,
    remat: str = "none",
    conditioning: str = "adaln",
    head_depth: int = 0,
    v_head: bool = False,
    qk_norm: bool = False,
    time_direction: str = "sit",
    returns_variance: bool = False,
) -> None:
    """Raise ``ConfigError`` (one line: the field, the value, what is accepted) for options the
    network cannot be built with; callable at config time, before anything is traced or written."""
    for field, value in (("depth", depth), ("hidden_size", hidden_size), ("num_heads", num_heads)):
        if not isinstance(value, int) or value < 1:
            raise _fail(field, value, "a positive int")
    if not isinstance(patch_size, int) or patch_size < 1:
        raise _fail("patch_size", patch_size, "a positive int")
    if hidden_size % num_heads:
        raise _fail("num_heads", num_heads, f"a divisor of hidden_size={hidden_size}")
    if hidden_size % 4:
        raise _fail("hidden_size", hidden_size, "a multiple of 4 (the 2-D sin-cos position embedding)")
    if input_size is not None and (input_size < 1 or input_size % patch_size):
        raise ConfigError(
            f"DiT: patch_size={patch_size} does not divide input_size={input_size}: "
            "expected a patch size that divides the latent resolution"
        )
    if conditioning not in CONDITIONINGS:
        raise _fail("conditioning", conditioning, f"one of {CONDITIONINGS}")
    if conditioning == "in_context":
        if tuple(time_inputs) != ("h",):
            raise _fail("time_inputs", tuple(time_inputs), "('h',) with conditioning='in_context' (iMF)")
        for field, value, default in (
            ("norm", norm, "layernorm"),
            ("mlp", mlp, "gelu_tanh"),
            ("qk_norm", qk_norm, False),
            ("rotary", rotary, False),
        ):
            if value != default:
                raise _fail(field, value, f"{default!r} with conditioning='in_context' (its block is iMF's)")
        if encoder_depth is not None or projector_dims:
            raise _fail("encoder_depth", encoder_depth, "None with conditioning='in_context'")
    elif tuple(time_inputs) not in TIME_INPUTS:
        raise _fail("time_inputs", tuple(time_inputs), " or ".join(map(str, TIME_INPUTS)))
    if not isinstance(head_depth, int) or not 0 <= head_depth <= depth:
        raise _fail("head_depth", head_depth, f"an int in 0..depth={depth}")
    if (head_depth or v_head) and conditioning != "in_context":
        raise _fail(
            "head_depth" if head_depth else "v_head", head_depth or v_head, "0 / False unless in_context"
        )
    if encoder_depth is not None and not 1 <= encoder_depth <= depth:
        raise ConfigError(
            f"DiT: encoder_depth={encoder_depth} is beyond the network: expected 1..depth={depth}"
        )
    if projector_dims and encoder_depth is None:
        raise _fail("encoder_depth", None, "a block index 1..depth when projector_dims is set")
    if not 0.0 <= class_dropout_prob < 1.0:
        raise _fail("class_dropout_prob", class_dropout_prob, "a probability in [0, 1)")
    if norm not in NORMS:
        raise _fail("norm", norm, f"one of {NORMS}")
    if mlp not in MLPS:
        raise _fail("mlp", mlp, f"one of {MLPS}")
    if rotary and (hidden_size // num_heads) % 4:
        raise _fail("rotary", rotary, "False unless hidden_size / num_heads is a multiple of 4")
    if remat not in REMAT_POLICIES:
        raise _fail("remat", remat, f"one of {tuple(REMAT_POLICIES)}")
    if time_direction not in TIME_DIRECTIONS:
        raise _fail("time_direction", time_direction, f"one of {TIME_DIRECTIONS}")
    if time_direction == "repa" and (conditioning != "adaln" or tuple(time_inputs) != ("t",)):
        raise _fail("time_direction", time_direction, "'sit' unless the network reads t alone (adaln)")
    if time_direction == "repa" and returns_variance:
        raise _fail(
            "time_direction", time_direction, "'sit' with learn_sigma and sigma_output (REPA has no variance)"
        )
