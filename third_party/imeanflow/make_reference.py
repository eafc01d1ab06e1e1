"""Goldens of Lyy-iiis/imeanflow's own ``iMeanFlow.forward`` and ``generate`` (imf.py).

Run with the reference's runtime (jax 0.4.27, flax 0.8.5; see README.md):

    python third_party/imeanflow/make_reference.py --imeanflow=/path/to/imeanflow-checkout

The reference's ``iMeanFlow`` builds its network with ``getattr(imfDiT, model_str)(name="net",
num_classes=..., eval=...)``. This script adds one more name to that module, ``TinyNet``: a small
deterministic network (below) with iMF's interface, (x, t, h, ω, t_min, t_max, y) -> (u, v),
whose function ``tiny_imf_net`` is written identically in ``tests/test_imeanflow_parity.py``, so
the objective is compared and not a network. Everything else is the reference's code,
unmodified: ``forward`` (the (t, r) draw, the CFG-scale and interval draws, the guided target
from the network's own v-head, class dropout, the JVP with the predicted tangent, the compound
V, the two adaptively weighted losses) and ``generate``.

Random draws are recorded as the reference makes them (``jax.random.normal``/``uniform``/
``randint`` wrapped by a recorder for one eager call, in call order), and so are the four
``jax.lax.stop_gradient`` arguments of ``forward`` (du/dt, v_g, then the u- and v-loss weights).
The gradient with respect to the network's parameters is ``jax.grad`` of ``forward``'s loss.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

NUM_CLASSES = 3
IMAGE = (4, 4, 2)  # H, W, C
WIDTH = 16
BATCH = 8


def tiny_imf_net(p, x, t, h, w, t_min, t_max, y):
    """a = tanh(x W1 + (sin(t a_t + b_t) + cos(h a_h + b_h) + sin((1 − 1/ω) a_w + b_w)
    + cos(t_min a_0 + b_0) + sin(t_max a_1 + b_1) + E[y]) Wc + b1);
    u = a W2u + s_u ⊙ x,  v = a W2v + s_v ⊙ x."""
    import jax.numpy as jnp

    b = x.shape[0]
    xf = x.reshape(b, -1)
    emb = (
        jnp.sin(t[:, None] * p["wt"] + p["bt"])
        + jnp.cos(h[:, None] * p["wh"] + p["bh"])
        + jnp.sin((1 - 1 / w)[:, None] * p["ww"] + p["bw"])
        + jnp.cos(t_min[:, None] * p["w0"] + p["b0"])
        + jnp.sin(t_max[:, None] * p["w1t"] + p["b1t"])
        + p["emb"][y]
    )
    a = jnp.tanh(xf @ p["w1"] + emb @ p["wc"] + p["b1"])
    u = (a @ p["w2u"] + xf * p["skip_u"]).reshape(x.shape)
    v = (a @ p["w2v"] + xf * p["skip_v"]).reshape(x.shape)
    return u, v


def tiny_params(seed: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    d = int(np.prod(IMAGE))
    shapes = {
        **{k: (WIDTH,) for k in ("wt", "bt", "wh", "bh", "ww", "bw", "w0", "b0", "w1t", "b1t", "b1")},
        "emb": (NUM_CLASSES + 1, WIDTH),
        "w1": (d, WIDTH),
        "wc": (WIDTH, WIDTH),
        "w2u": (WIDTH, d),
        "w2v": (WIDTH, d),
        "skip_u": (d,),
        "skip_v": (d,),
    }
    scale = {"w1": d**-0.5, "wc": WIDTH**-0.5, "w2u": WIDTH**-0.5, "w2v": WIDTH**-0.5}
    scale.update({k: 3.0 for k in ("wt", "wh", "ww", "w0", "w1t")})
    return {k: (g.standard_normal(s) * scale.get(k, 0.5)).astype(np.float32) for k, s in shapes.items()}


class Recorder:
    """Wraps named functions of a module; records each concrete call's output in order."""

    def __init__(self, module, names):
        self.module, self.names, self.calls, self.saved = module, names, [], {}

    def __enter__(self):
        import jax

        for name in self.names:
            original = getattr(self.module, name)
            self.saved[name] = original

            def wrapped(*args, _name=name, _original=original, **kwargs):
                out = _original(*args, **kwargs)
                if not isinstance(out, jax.core.Tracer):  # flax's shape check traces initialisers
                    self.calls.append((_name, np.asarray(out)))
                return out

            setattr(self.module, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(self.module, name, original)


CASES = {
    # configs/default.py: logit-normal(-0.4, 1), data_proportion 0.5, cfg_beta 1 (log-uniform ω),
    # adaptive weight p=1, eps=0.01; class dropout raised so that rows are dropped.
    "default": dict(P_mean=-0.4, P_std=1.0, data_proportion=0.5, cfg_beta=1.0, class_dropout_prob=0.4),
    # The power-law ω draw (cfg_beta != 1), another weighting and proportion.
    "beta": dict(
        P_mean=-0.2, P_std=0.8, data_proportion=0.25, cfg_beta=2.0, class_dropout_prob=0.3, norm_p=0.5
    ),
}
DRAW_NAMES = ("t_raw", "r_raw", "noise", "t_min", "t_max", "omega_uniform", "drop_uniform")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--imeanflow", required=True, help="a checkout of Lyy-iiis/imeanflow")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    sys.path.insert(0, args.imeanflow)
    os.chdir(args.imeanflow)

    import flax
    import flax.linen as nn
    import imf
    import jax
    import jax.numpy as jnp
    import ml_collections
    from models import imfDiT

    class TinyNet(nn.Module):
        num_classes: int = NUM_CLASSES
        eval: bool = False

        @nn.compact
        def __call__(self, x, t, h, w, t_min, t_max, y):
            p = {k: self.param(k, nn.initializers.zeros, v.shape) for k, v in tiny_params(0).items()}
            return tiny_imf_net(p, x, t, h, w, t_min, t_max, y)

    imfDiT.TinyNet = TinyNet
    params = tiny_params(0)
    net_params = {k: jnp.asarray(v) for k, v in params.items()}
    g = np.random.default_rng(1)
    x = g.standard_normal((BATCH, *IMAGE)).astype(np.float32)
    y = g.integers(0, NUM_CLASSES, BATCH).astype(np.int32)

    out: dict[str, np.ndarray] = {f"param_{k}": v for k, v in params.items()}
    out["x"], out["y"] = x, y
    meta = {"num_classes": NUM_CLASSES, "cases": {}}
    for case, (name, settings) in enumerate(CASES.items()):
        model = imf.iMeanFlow(model_str="TinyNet", num_classes=NUM_CLASSES, **settings)
        key = jax.random.PRNGKey(200 + case)

        def loss_fn(p, model=model, key=key):
            return model.apply({"params": {"net": p}}, x, y, method=model.forward, rngs={"gen": key})

        with (
            Recorder(jax.random, ("normal", "uniform")) as draws,
            Recorder(jax.lax, ("stop_gradient",)) as sg,
        ):
            loss, aux = loss_fn(net_params)
        kinds = [n for n, _ in draws.calls]
        assert kinds == ["normal"] * 3 + ["uniform"] * 4, kinds
        assert len(sg.calls) == 4, [v.shape for _, v in sg.calls]
        grads = jax.grad(lambda p, f=loss_fn: f(p)[0])(net_params)
        recorded = dict(zip(DRAW_NAMES, (v for _, v in draws.calls), strict=True))
        n_drop = int(np.sum(recorded["drop_uniform"] < settings["class_dropout_prob"]))
        meta["cases"][name] = {"settings": settings, "rows_dropped": n_drop}
        for k, v in recorded.items():
            out[f"{name}/{k}"] = v.reshape(BATCH) if v.size == BATCH else v
        out[f"{name}/loss"] = np.asarray(loss)
        out[f"{name}/loss_u"] = np.asarray(aux["loss_u"])
        out[f"{name}/loss_v"] = np.asarray(aux["loss_v"])
        out[f"{name}/du_dt"] = sg.calls[0][1]
        out[f"{name}/v_g"] = sg.calls[1][1]
        out[f"{name}/weight_u"] = sg.calls[2][1]
        out[f"{name}/weight_v"] = sg.calls[3][1]
        for k, v in grads.items():
            out[f"{name}/grad_{k}"] = np.asarray(v)

    # generate: 1 and 2 steps (t points linspace(1, 0, n + 1)), with a CFG scale and interval.
    config = ml_collections.ConfigDict(
        {"dataset": {"num_classes": NUM_CLASSES, "image_size": IMAGE[0], "image_channels": IMAGE[2]}}
    )
    model = imf.iMeanFlow(model_str="TinyNet", num_classes=NUM_CLASSES, eval=True)
    for steps, (omega, t_min, t_max) in ((1, (7.5, 0.4, 0.65)), (2, (4.0, 0.36, 0.64))):
        with Recorder(jax.random, ("normal", "randint")) as draws:
            images = imf.generate(
                {"params": {"net": net_params}}, model, jax.random.PRNGKey(7 + steps), BATCH, config,
                steps, omega, t_min, t_max,
            )  # fmt: skip
        (_, z), (_, labels) = draws.calls
        out[f"generate{steps}/noise"] = z
        out[f"generate{steps}/labels"] = labels
        out[f"generate{steps}/guidance"] = np.asarray([omega, t_min, t_max], np.float32)
        out[f"generate{steps}/images"] = np.asarray(images)

    meta["versions"] = {"jax": jax.__version__, "flax": flax.__version__, "numpy": np.__version__}
    out["meta_json"] = np.asarray(json.dumps(meta, sort_keys=True))
    path = os.path.join(args.out, "imeanflow_reference.npz")
    np.savez_compressed(path, **out)
    print(path, json.dumps(meta["cases"], default=str))
    network_goldens(args.out, Recorder)


# --- the reference's own network (models/imfDiT.py) --------------------------------------------------
# A tiny size of ``imfDiT`` (depth 3 with aux_head_depth 1: one shared block and one block in each
# of the u and v heads; the reference's token counts 8 / 4 / 2 + 2 / 4), built by the reference's
# ``iMeanFlow.setup`` as ``getattr(imfDiT, "imfDiT_Tiny")(name="net", num_classes=3, eval=...)``, on
# random weights: every leaf of ``init``'s tree replaced (kernels N(0, 1/fan_in), biases N(0, 0.1²),
# tokens, tables and the zero-initialised gates and RMSNorm scales N(0, 1)), so every part acts.
IMF_DIT = dict(
    input_size=8, patch_size=2, in_channels=2, hidden_size=32, depth=3, num_heads=4, aux_head_depth=1
)
DIT_IMAGE = (8, 8, 2)


def random_tree(tree, seed: int):
    """Every leaf of a flax params tree replaced by random values (kernels N(0, 1/fan_in), where
    fan_in is the product of all axes but the last; biases N(0, 0.1²); other leaves N(0, 1))."""
    g = np.random.default_rng(seed)

    def leaf(path, value):
        shape = np.shape(value)
        if path[-1] == "kernel" and len(shape) > 1:
            scale = float(np.prod(shape[:-1])) ** -0.5
        elif path[-1] == "bias":
            scale = 0.1
        else:
            scale = 1.0
        return (g.standard_normal(shape) * scale).astype(np.float32)

    def walk(node, path=()):
        return {
            k: walk(v, (*path, k)) if isinstance(v, dict) else leaf((*path, k), v) for k, v in node.items()
        }

    return walk(tree)


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def network_goldens(out_dir: str, Recorder) -> None:
    """imeanflow_dit_reference.npz: the reference network's (u, v), and ``forward``/``generate``
    with it."""
    import functools

    import flax
    import imf
    import jax
    import jax.numpy as jnp
    import ml_collections
    from flax.core import unfreeze
    from models import imfDiT

    imfDiT.imfDiT_Tiny = functools.partial(imfDiT.imfDiT, **IMF_DIT)
    net = imfDiT.imfDiT_Tiny(num_classes=NUM_CLASSES)
    g = np.random.default_rng(21)
    x = g.standard_normal((BATCH, *DIT_IMAGE)).astype(np.float32)
    y = g.integers(0, NUM_CLASSES + 1, BATCH).astype(np.int32)  # the null class included
    t = g.uniform(0, 1, BATCH).astype(np.float32)
    h = (t * g.uniform(0, 1, BATCH)).astype(np.float32)
    w = np.exp(g.uniform(0, np.log(8.0), BATCH)).astype(np.float32)
    t_min = g.uniform(0, 0.5, BATCH).astype(np.float32)
    t_max = g.uniform(0.5, 1.0, BATCH).astype(np.float32)
    inputs = (x, t, h, w, t_min, t_max, y)
    shapes = unfreeze(net.init(jax.random.PRNGKey(0), *inputs))["params"]
    params = random_tree(shapes, seed=22)
    jparams = jax.tree_util.tree_map(jnp.asarray, params)
    out = {f"param/{k}": v for k, v in flat(params).items()}
    for k, v in zip(("x", "t", "h", "omega", "t_min", "t_max", "y"), inputs, strict=True):
        out[f"net/{k}"] = v
    u, v = net.apply({"params": jparams}, *inputs)
    out["net/u"], out["net/v"] = np.asarray(u), np.asarray(v)

    labels = y % NUM_CLASSES
    out["labels"] = labels
    meta = {"imf_dit": IMF_DIT, "num_classes": NUM_CLASSES, "cases": {}}
    for case, (name, settings) in enumerate(CASES.items()):
        model = imf.iMeanFlow(model_str="imfDiT_Tiny", num_classes=NUM_CLASSES, **settings)
        key = jax.random.PRNGKey(300 + case)

        def loss_fn(p, model=model, key=key):
            return model.apply({"params": {"net": p}}, x, labels, method=model.forward, rngs={"gen": key})

        with (
            Recorder(jax.random, ("normal", "uniform")) as draws,
            Recorder(jax.lax, ("stop_gradient",)) as sg,
        ):
            loss, aux = loss_fn(jparams)
        kinds = [n for n, _ in draws.calls]
        assert kinds == ["normal"] * 3 + ["uniform"] * 4, kinds
        # the softmax inside attention stops gradients too ([B, heads, T, 1]); forward's own four
        # are the recorded arrays shaped as the batch or as one value per row
        own = [v for _, v in sg.calls if v.shape in (x.shape, (BATCH,))]
        assert [v.shape for v in own] == [x.shape, x.shape, (BATCH,), (BATCH,)], [v.shape for v in own]
        grads = jax.grad(lambda p, f=loss_fn: f(p)[0])(jparams)
        recorded = dict(zip(DRAW_NAMES, (v for _, v in draws.calls), strict=True))
        n_drop = int(np.sum(recorded["drop_uniform"] < settings["class_dropout_prob"]))
        meta["cases"][name] = {"settings": settings, "rows_dropped": n_drop}
        for k, v in recorded.items():
            out[f"{name}/{k}"] = v.reshape(BATCH) if v.size == BATCH else v
        out[f"{name}/loss"] = np.asarray(loss)
        out[f"{name}/loss_u"] = np.asarray(aux["loss_u"])
        out[f"{name}/loss_v"] = np.asarray(aux["loss_v"])
        for k, v in zip(("du_dt", "v_g", "weight_u", "weight_v"), own, strict=True):
            out[f"{name}/{k}"] = v
        for k, v in flat(grads).items():
            out[f"{name}/grad/{k}"] = v

    config = ml_collections.ConfigDict(
        {"dataset": {"num_classes": NUM_CLASSES, "image_size": DIT_IMAGE[0], "image_channels": DIT_IMAGE[2]}}
    )
    model = imf.iMeanFlow(model_str="imfDiT_Tiny", num_classes=NUM_CLASSES, eval=True)
    for steps, (omega, lo, hi) in ((1, (7.5, 0.4, 0.65)), (2, (4.0, 0.36, 0.64))):
        with Recorder(jax.random, ("normal", "randint")) as draws:
            images = imf.generate(
                {"params": {"net": jparams}}, model, jax.random.PRNGKey(27 + steps), BATCH, config,
                steps, omega, lo, hi,
            )  # fmt: skip
        (_, z), (_, gen_labels) = draws.calls
        out[f"generate{steps}/noise"] = z
        out[f"generate{steps}/labels"] = gen_labels
        out[f"generate{steps}/guidance"] = np.asarray([omega, lo, hi], np.float32)
        out[f"generate{steps}/images"] = np.asarray(images)

    meta["versions"] = {"jax": jax.__version__, "flax": flax.__version__, "numpy": np.__version__}
    out["meta_json"] = np.asarray(json.dumps(meta, sort_keys=True))
    path = os.path.join(out_dir, "imeanflow_dit_reference.npz")
    np.savez_compressed(path, **out)
    print(path, json.dumps(meta["cases"], default=str))


if __name__ == "__main__":
    main()
