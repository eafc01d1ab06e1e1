"""``python -m dew.fid --metrics=...``: FD_DINOv2 beside FID from one pass over the same batches
(``dew.scoring.feature_metrics``), on small random DINOv2 weights the test makes and converts
with dew's own converter."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from PIL import Image

from dew.scoring import dinov2, dinov2_weights, distances, feature_metrics, feature_scorer
from dew.scoring.dinov2_metrics import DINOv2Scorer

# 64 channels per head (what config_from_torch_names assumes), one block: a DINOv2 in miniature
SMALL = dinov2.ViTConfig(embed_dim=64, depth=1, num_heads=1, patch_size=14, mlp_ratio=2, train_grid=4)


def _state_dict(config: dinov2.ViTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays under the official dinov2 state_dict names and shapes for ``config``."""
    rng = np.random.default_rng(seed)
    d, h = config.embed_dim, config.embed_dim * config.mlp_ratio
    p, g = config.patch_size, config.train_grid
    shapes = {
        "cls_token": (1, 1, d),
        "pos_embed": (1, 1 + g * g, d),
        "mask_token": (1, d),
        "patch_embed.proj.weight": (d, 3, p, p),
        "patch_embed.proj.bias": (d,),
        "norm.weight": (d,),
        "norm.bias": (d,),
    }
    for i in range(config.depth):
        b = f"blocks.{i}."
        shapes.update({
            b + "norm1.weight": (d,), b + "norm1.bias": (d,), b + "norm2.weight": (d,),
            b + "norm2.bias": (d,), b + "ls1.gamma": (d,), b + "ls2.gamma": (d,),
            b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,),
            b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
            b + "mlp.fc1.weight": (h, d), b + "mlp.fc1.bias": (h,),
            b + "mlp.fc2.weight": (d, h), b + "mlp.fc2.bias": (d,),
        })  # fmt: skip
    out = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = 1.0 if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")) else 0.0
        out[name] = (scale + rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("dinov2") / "small.npz"
    dinov2_weights.convert(_state_dict(SMALL), str(path), source_sha256="0" * 64, config=SMALL)
    return path


def _pngs(folder: pathlib.Path, images: np.ndarray) -> None:
    folder.mkdir()
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"{i:03d}.png")


def test_metrics_flag_accepts_known_names_only():
    assert feature_metrics.parse_metrics("fid,fd_dinov2") == ("fid", "fd_dinov2")
    assert feature_metrics.parse_metrics("fd_dinov2") == ("fd_dinov2",)
    for bad in ("fid,fid", "is", "", "fid,,fd_dinov2"):
        with pytest.raises(ValueError, match="--metrics="):
            feature_metrics.parse_metrics(bad)


def test_statistics_over_feeds_every_scorer_the_same_batches_once(weights):
    """Two scorers (different weights) over a one-shot generator: each gets exactly what it gets
    alone, so a run's samples are drawn once for all metrics."""
    a = DINOv2Scorer(weights_path=str(weights), allow_unpinned=True)
    assert a.config == SMALL  # the shape is read back from the arrays
    b = DINOv2Scorer(params=dinov2.params_from_torch_names(_state_dict(SMALL, seed=1), SMALL), config=SMALL)
    images = np.random.default_rng(2).uniform(0, 1, (5, 20, 20, 3)).astype(np.float32)
    drawn = []

    def once():
        for i in (0, 3):
            drawn.append(i)
            yield images[i : i + 3]

    stats = feature_scorer.statistics_over({"x": a, "y": b}, once(), (0.0, 1.0))
    assert drawn == [0, 3]
    for name, scorer in (("x", a), ("y", b)):
        alone = scorer.statistics([images[0:3], images[3:6]], (0.0, 1.0))  # the same batches, alone
        np.testing.assert_array_equal(stats[name].mu, alone.mu)
        np.testing.assert_array_equal(stats[name].sigma, alone.sigma)


def test_fid_cli_reports_fd_dinov2_of_folders_as_the_library_computes_it(weights, tmp_path, capsys):
    from dew.fid import main

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (6, 28, 28, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-80, 80, a.shape), 0, 255).astype(np.uint8)
    _pngs(tmp_path / "a", a)
    _pngs(tmp_path / "b", b)
    common = [
        "--metrics=fd_dinov2",
        f"--dinov2_weights={weights}",
        "--allow_unpinned_weights",
        "--batch_size=4",
    ]
    saved = tmp_path / "a_dinov2.npz"
    assert main([f"--images={tmp_path / 'a'}", f"--save_dinov2_stats={saved}", *common]) == 0
    assert main([f"--images={tmp_path / 'b'}", f"--dinov2_ref={saved}", *common]) == 0
    assert main([f"--images={tmp_path / 'b'}", f"--ref={tmp_path / 'a'}", *common]) == 0
    out = capsys.readouterr().out
    values = [
        float(line.split()[1])
        for line in out.splitlines()
        if line.startswith("FD_DINOv2 ") and "->" not in line
    ]
    scorer = DINOv2Scorer(weights_path=str(weights), allow_unpinned=True)
    fa, fb = (
        feature_scorer.statistics_over({"d": scorer}, [x.astype(np.float32) / 255], (0.0, 1.0), batch_size=4)[
            "d"
        ]
        for x in (a, b)
    )  # the CLI's batches (--batch_size=4, the last padded) through the library: bit for bit
    expected = distances.frechet_distance(fb.mu, fb.sigma, fa.mu, fa.sigma)
    assert values == [float(expected)] * 2
    assert values[0] > 0

    bad = [
        [f"--images={tmp_path / 'b'}", *common],  # no reference of any kind
        [f"--images={tmp_path / 'b'}", f"--dinov2_ref={saved}", *common[:1], "--allow_unpinned_weights",
         f"--dinov2_weights={tmp_path / 'absent.npz'}"],
        [f"--images={tmp_path / 'b'}", f"--dinov2_ref={saved}", "--metrics=fid,kid"],
        [f"--images={tmp_path / 'b'}", f"--dinov2_ref={saved}", "--metrics=fid"],  # flag without metric
        [f"--images={tmp_path / 'b'}", f"--dinov2_ref={saved}", f"--dinov2_weights={weights}",
         "--metrics=fd_dinov2"],  # unpinned refused
    ]  # fmt: skip
    for argv in bad:
        assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(bad) and all(line.startswith("error: ") for line in err), err
    assert "--dinov2_ref" in err[0] and "absent.npz" in err[1] and "--metrics='fid,kid'" in err[2]
    assert "--dinov2_ref only apply" in err[3] and "not pinned" in err[4]
    assert not (tmp_path / "absent.npz").exists()
