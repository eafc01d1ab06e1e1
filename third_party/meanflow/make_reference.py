"""Goldens of Gsunshine/meanflow's own ``MeanFlow.forward`` and ``generate`` (meanflow.py).

Run with the reference's runtime (jax 0.4.27, flax 0.8.5; see README.md):

    python third_party/meanflow/make_reference.py --meanflow=/path/to/meanflow-checkout

The reference's ``MeanFlow`` builds its network with ``getattr(models_dit, model_str)(name="net",
class_dropout_prob=0.0)``. This script adds one more name to that module, ``TinyNet``: a small
deterministic network (below) whose function ``tiny_net`` is written identically in
``tests/test_meanflow_parity.py``, so the objective is compared and not a network. Everything
else is the reference's code, unmodified: ``forward`` (the (t, r) draw, guidance, class dropout,
the JVP, the target, the adaptive weight) and ``generate`` (its schedule and solver step).

Random draws are recorded as the reference makes them (``jax.random.normal``/``uniform``/
``randint`` are wrapped by a recorder for one eager call, in call order), and so are the two
``jax.lax.stop_gradient`` arguments of ``forward`` (the target u_tgt, then the adaptive weight).
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


def tiny_net(p, x, t, h, y):
    """u(x, t, h, y) = tanh(x W1 + (sin(t a_t + b_t) + cos(h a_h + b_h) + E[y]) Wc + b1) W2 + s ⊙ x."""
    import jax.numpy as jnp

    b = x.shape[0]
    xf = x.reshape(b, -1)
    emb = jnp.sin(t[:, None] * p["wt"] + p["bt"]) + jnp.cos(h[:, None] * p["wh"] + p["bh"]) + p["emb"][y]
    a = jnp.tanh(xf @ p["w1"] + emb @ p["wc"] + p["b1"])
    return (a @ p["w2"] + xf * p["skip"]).reshape(x.shape)


def tiny_params(seed: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    d = int(np.prod(IMAGE))
    shapes = {
        "wt": (WIDTH,),
        "bt": (WIDTH,),
        "wh": (WIDTH,),
        "bh": (WIDTH,),
        "emb": (NUM_CLASSES + 1, WIDTH),
        "w1": (d, WIDTH),
        "wc": (WIDTH, WIDTH),
        "b1": (WIDTH,),
        "w2": (WIDTH, d),
        "skip": (d,),
    }
    scale = {"w1": d**-0.5, "wc": WIDTH**-0.5, "w2": WIDTH**-0.5, "wt": 3.0, "wh": 3.0}
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
    # The reference's defaults (configs/default.py: logit-normal(-0.4, 1), data_proportion 0.75,
    # cfg with omega 1, kappa 0.5, adaptive weight p=1, eps=0.01) with a guidance interval that
    # leaves some rows outside and a class-dropout probability high enough to drop rows.
    "cfg_kappa": dict(
        noise_dist="logit_normal",
        P_mean=-0.4,
        P_std=1.0,
        data_proportion=0.75,
        guidance_eq="cfg",
        omega=1.0,
        kappa=0.5,
        class_dropout_prob=0.45,
        t_start=0.3,
        t_end=0.8,
        norm_p=1.0,
        norm_eps=0.01,
    ),
    # Plain CFG (kappa = 0, omega 2 as in the reference README's second row), another weighting.
    "cfg_omega": dict(
        noise_dist="logit_normal",
        P_mean=-0.4,
        P_std=1.0,
        data_proportion=0.5,
        guidance_eq="cfg",
        omega=2.0,
        kappa=0.0,
        class_dropout_prob=0.3,
        t_start=0.0,
        t_end=1.0,
        norm_p=0.5,
        norm_eps=0.01,
    ),
    # No guidance, uniform (t, r), all rows with r != t.
    "plain_uniform": dict(
        noise_dist="uniform",
        P_mean=-0.4,
        P_std=1.0,
        data_proportion=0.0,
        guidance_eq="none",
        omega=1.0,
        kappa=0.5,
        class_dropout_prob=0.1,
        t_start=0.0,
        t_end=1.0,
        norm_p=1.0,
        norm_eps=0.01,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meanflow", required=True, help="a checkout of Gsunshine/meanflow")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    sys.path.insert(0, args.meanflow)
    os.chdir(args.meanflow)

    import flax
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import meanflow as mf_module
    import ml_collections
    from models import models_dit

    class TinyNet(nn.Module):
        class_dropout_prob: float = 0.0  # the reference passes it; the tiny net has no dropout

        @nn.compact
        def __call__(self, x, t, h, y, train=False, key=None):
            p = {k: self.param(k, nn.initializers.zeros, v.shape) for k, v in tiny_params(0).items()}
            return tiny_net(p, x, t, h, y)

    models_dit.TinyNet = TinyNet
    params = tiny_params(0)
    variables = {"params": {"net": {k: jnp.asarray(v) for k, v in params.items()}}}
    g = np.random.default_rng(1)
    x = g.standard_normal((BATCH, *IMAGE)).astype(np.float32)
    y = g.integers(0, NUM_CLASSES, BATCH).astype(np.int32)

    out: dict[str, np.ndarray] = {f"param_{k}": v for k, v in params.items()}
    out["x"], out["y"] = x, y
    meta = {"num_classes": NUM_CLASSES, "cases": {}}
    for case, (name, settings) in enumerate(CASES.items()):
        model = mf_module.MeanFlow(model_str="TinyNet", model_config={}, num_classes=NUM_CLASSES, **settings)
        key = jax.random.PRNGKey(100 + case)

        def loss_fn(p, model=model, key=key):
            return model.apply({"params": {"net": p}}, x, y, method=model.forward, rngs={"gen": key})

        with (
            Recorder(jax.random, ("normal", "uniform")) as draws,
            Recorder(jax.lax, ("stop_gradient",)) as sg,
        ):
            loss, aux = loss_fn(variables["params"]["net"])
        kinds = [n for n, _ in draws.calls]
        assert kinds == ["normal", "normal", "normal", "uniform"] or kinds == [
            "uniform",
            "uniform",
            "normal",
            "uniform",
        ], kinds
        t_raw, r_raw, noise, drop_u = (v for _, v in draws.calls)
        assert len(sg.calls) == 2, [v.shape for _, v in sg.calls]
        grads = jax.grad(lambda p: loss_fn(p)[0])(variables["params"]["net"])
        n_drop = int(np.sum(drop_u < settings["class_dropout_prob"]))
        meta["cases"][name] = {"settings": settings, "rows_dropped": n_drop}
        out[f"{name}/t_raw"] = t_raw.reshape(BATCH)
        out[f"{name}/r_raw"] = r_raw.reshape(BATCH)
        out[f"{name}/noise"] = noise
        out[f"{name}/drop_uniform"] = drop_u
        out[f"{name}/loss"] = np.asarray(loss)
        out[f"{name}/v_loss"] = np.asarray(aux["v_loss"])
        out[f"{name}/u_tgt"] = sg.calls[0][1]
        out[f"{name}/adaptive_weight"] = sg.calls[1][1]
        for k, v in grads.items():
            out[f"{name}/grad_{k}"] = np.asarray(v)

    # generate: 1 step on the default schedule [1, 0], 2 steps on [1, 0.5, 0] (sampling_timesteps).
    for steps, schedule in ((1, None), (2, (1.0, 0.5, 0.0))):
        config = ml_collections.ConfigDict(
            {
                "sampling": {"num_steps": steps},
                "dataset": {"num_classes": NUM_CLASSES, "image_size": IMAGE[0], "image_channels": IMAGE[2]},
            }
        )
        model = mf_module.MeanFlow(
            model_str="TinyNet",
            model_config={},
            num_classes=NUM_CLASSES,
            num_steps=steps,
            sampling_timesteps=None if schedule is None else jnp.asarray(schedule),
        )
        with Recorder(jax.random, ("normal", "randint")) as draws:
            images = mf_module.generate(variables, model, jax.random.PRNGKey(7 + steps), BATCH, config)
        (_, z), (_, labels) = draws.calls
        out[f"generate{steps}/noise"] = z
        out[f"generate{steps}/labels"] = labels
        out[f"generate{steps}/schedule"] = np.asarray(
            [1.0, 0.0] if schedule is None else schedule, np.float32
        )
        out[f"generate{steps}/images"] = np.asarray(images)

    meta["versions"] = {"jax": jax.__version__, "flax": flax.__version__, "numpy": np.__version__}
    out["meta_json"] = np.asarray(json.dumps(meta, sort_keys=True))
    path = os.path.join(args.out, "meanflow_reference.npz")
    np.savez_compressed(path, **out)
    print(path, json.dumps(meta["cases"], default=str))
    dit_goldens(args.out, Recorder)


# --- the reference's own DiT (models/models_dit.py) ------------------------------------------------
# A tiny size of the reference's ``DiT`` (its second time embedding ``h_embedder`` included), built by
# the reference's ``MeanFlow.setup`` as ``getattr(models_dit, "DiT_Tiny")(name="net",
# class_dropout_prob=0.0)``, on random weights: every leaf of ``model.init``'s tree replaced by
# N(0, 1/fan_in) kernels and N(0, 0.1²) biases, so the zero-initialised adaLN and final layers act.
DIT = dict(input_size=8, patch_size=2, in_channels=2, hidden_size=32, depth=2, num_heads=4, num_classes=3)
DIT_IMAGE = (8, 8, 2)


def random_tree(tree, seed: int):
    """Every leaf of a flax params tree replaced by random values (kernels N(0, 1/fan_in), where
    fan_in is the product of all axes but the last; biases N(0, 0.1²); embeddings N(0, 1))."""
    g = np.random.default_rng(seed)

    def leaf(path, value):
        shape = np.shape(value)
        if path[-1] == "kernel":
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


def dit_goldens(out_dir: str, Recorder) -> None:
    """meanflow_dit_reference.npz: the reference DiT's output, and ``forward``/``generate`` with it."""
    import functools

    import flax
    import jax
    import jax.numpy as jnp
    import meanflow as mf_module
    import ml_collections
    from flax.core import unfreeze
    from models import models_dit

    models_dit.DiT_Tiny = functools.partial(models_dit.DiT, **DIT)
    net = models_dit.DiT_Tiny(class_dropout_prob=0.0)
    g = np.random.default_rng(11)
    x = g.standard_normal((BATCH, *DIT_IMAGE)).astype(np.float32)
    y = g.integers(0, DIT["num_classes"] + 1, BATCH).astype(np.int32)  # the null class included
    t = g.uniform(0, 1, BATCH).astype(np.float32)
    h = (t * g.uniform(0, 1, BATCH)).astype(np.float32)
    shapes = unfreeze(net.init(jax.random.PRNGKey(0), jnp.asarray(x), t, h, y))["params"]
    params = random_tree(shapes, seed=12)
    jparams = jax.tree_util.tree_map(jnp.asarray, params)
    out = {f"param/{k}": v for k, v in flat(params).items()}
    out["net/x"], out["net/t"], out["net/h"], out["net/y"] = x, t, h, y
    out["net/out"] = np.asarray(net.apply({"params": jparams}, x, t, h, y))

    labels = y % DIT["num_classes"]
    out["labels"] = labels
    meta = {"dit": DIT, "cases": {}}
    for case, name in enumerate(("cfg_kappa", "cfg_omega")):
        settings = CASES[name]
        model = mf_module.MeanFlow(
            model_str="DiT_Tiny", model_config={}, num_classes=DIT["num_classes"], **settings
        )
        key = jax.random.PRNGKey(200 + case)

        def loss_fn(p, model=model, key=key):
            return model.apply({"params": {"net": p}}, x, labels, method=model.forward, rngs={"gen": key})

        with (
            Recorder(jax.random, ("normal", "uniform")) as draws,
            Recorder(jax.lax, ("stop_gradient",)) as sg,
        ):
            loss, aux = loss_fn(jparams)
        assert [n for n, _ in draws.calls] == ["normal", "normal", "normal", "uniform"], draws.calls
        t_raw, r_raw, noise, drop_u = (v for _, v in draws.calls)
        grads = jax.grad(lambda p: loss_fn(p)[0])(jparams)
        meta["cases"][name] = {
            "settings": settings,
            "rows_dropped": int(np.sum(drop_u < settings["class_dropout_prob"])),
        }
        out[f"{name}/t_raw"], out[f"{name}/r_raw"] = t_raw.reshape(BATCH), r_raw.reshape(BATCH)
        out[f"{name}/noise"], out[f"{name}/drop_uniform"] = noise, drop_u
        out[f"{name}/loss"], out[f"{name}/v_loss"] = np.asarray(loss), np.asarray(aux["v_loss"])
        # the softmax inside attention stops gradients too: forward's own two are the last calls
        u_tgt, adp_wt = sg.calls[-2][1], sg.calls[-1][1]
        assert u_tgt.shape == x.shape and adp_wt.shape == (BATCH,), (u_tgt.shape, adp_wt.shape)
        out[f"{name}/u_tgt"], out[f"{name}/adaptive_weight"] = u_tgt, adp_wt
        for k, v in flat(grads).items():
            out[f"{name}/grad/{k}"] = v

    for steps, schedule in ((1, None), (2, (1.0, 0.5, 0.0))):
        config = ml_collections.ConfigDict(
            {
                "sampling": {"num_steps": steps},
                "dataset": {
                    "num_classes": DIT["num_classes"],
                    "image_size": DIT_IMAGE[0],
                    "image_channels": DIT_IMAGE[2],
                },
            }
        )
        model = mf_module.MeanFlow(
            model_str="DiT_Tiny",
            model_config={},
            num_classes=DIT["num_classes"],
            num_steps=steps,
            sampling_timesteps=None if schedule is None else jnp.asarray(schedule),
        )
        variables = {"params": {"net": jparams}}
        with Recorder(jax.random, ("normal", "randint")) as draws:
            images = mf_module.generate(variables, model, jax.random.PRNGKey(17 + steps), BATCH, config)
        (_, z), (_, gen_labels) = draws.calls
        out[f"generate{steps}/noise"], out[f"generate{steps}/labels"] = z, gen_labels
        points = [1.0, 0.0] if schedule is None else schedule
        out[f"generate{steps}/schedule"] = np.asarray(points, np.float32)
        out[f"generate{steps}/images"] = np.asarray(images)

    meta["versions"] = {"jax": jax.__version__, "flax": flax.__version__, "numpy": np.__version__}
    out["meta_json"] = np.asarray(json.dumps(meta, sort_keys=True))
    path = os.path.join(out_dir, "meanflow_dit_reference.npz")
    np.savez_compressed(path, **out)
    print(path, json.dumps(meta["cases"], default=str))


if __name__ == "__main__":
    main()
