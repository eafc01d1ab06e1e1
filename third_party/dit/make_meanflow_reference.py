"""Golden outputs of Gsunshine/meanflow's own DiT (``models/models_dit.py``, flax) on random weights:
the network with the second time input h that dew's ``time_inputs=("t", "h")`` reproduces
(tests/test_dit.py). Run with the checkout as argument (its code is not part of dew):

    JAX_PLATFORMS=cpu /work/main/.venv/bin/python third_party/dit/make_meanflow_reference.py \
        --meanflow=/path/to/meanflow --out=third_party/dit

Built as ``meanflow.py`` builds it (``class_dropout_prob=0.0``, ``learn_sigma=False``) at the
size of the other goldens; every parameter redrawn as in make_reference.py (weights N(0, 1/fan_in),
biases N(0, 0.1²), the label table N(0, 1)), rounded to float16 (exact in float32).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4, num_classes=10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meanflow", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    sys.path.insert(0, str(args.meanflow))
    import jax
    import jax.numpy as jnp
    from models import models_dit

    config = dict(TINY, class_dropout_prob=0.0, learn_sigma=False)
    model = models_dit.DiT(**config)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 8, 8, 4)).astype(np.float32)  # NHWC, as the reference takes it
    t = np.array([0.0, 0.3, 0.999, 0.6], np.float32)
    h = np.array([0.0, 0.2, 0.5, 0.6], np.float32)  # h = t - r
    y = np.array([0, 3, TINY["num_classes"], 9], np.int32)  # one null-class label
    variables = model.init(jax.random.PRNGKey(0), jnp.asarray(x), t, h, y)

    def redraw(path, leaf):
        name = jax.tree_util.keystr(path)
        shape = leaf.shape
        if name.endswith("['embedding']"):
            value = rng.standard_normal(shape)
        elif name.endswith("['kernel']"):
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))
        else:
            value = 0.1 * rng.standard_normal(shape)
        return jnp.asarray(value.astype(np.float16).astype(np.float32))

    variables = jax.tree_util.tree_map_with_path(redraw, variables)
    out = model.apply(variables, jnp.asarray(x), t, h, y, train=False)
    result = {
        "x": x,
        "t": t,
        "h": h,
        "y": y,
        "out": np.asarray(out),
        "config_json": np.array(json.dumps(config)),
    }
    for path, leaf in jax.tree_util.tree_flatten_with_path(variables["params"])[0]:
        key = "/".join(p.key for p in path)
        result[f"param/{key}"] = np.asarray(leaf).astype(np.float16)
    np.savez(args.out / "meanflow_dit_tiny.npz", **result)


if __name__ == "__main__":
    main()
