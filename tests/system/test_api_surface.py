"""The package surface of the seed API reference, and the layering rules, each checked in a
fresh interpreter so nothing imported by another test can hide a violation."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = ROOT.parent / "shared" / "seeds" / "dew-api-reference.txt"

# The export table of ../shared/seeds/dew-api-reference.txt.
SEED_NAMES = [
    "CFG",
    "Aux",
    "Checkpoints",
    "Condition",
    "Dataset",
    "EMASpec",
    "Evaluation",
    "Field",
    "ImageGrid",
    "InputSpec",
    "Layout",
    "LocalTracker",
    "MLflowTracker",
    "MeshSpec",
    "Objective",
    "Process",
    "ProfileWindow",
    "Representations",
    "Step",
    "TensorBoardTracker",
    "TextSamples",
    "TokenScores",
    "Tracker",
    "Trackers",
    "TrainState",
    "Trainer",
    "VideoGrid",
    "WandbTracker",
    "datasets",
    "encoders",
    "evaluate",
    "metrics",
    "models",
    "pipeline",
    "presets",
    "profile",
    "sample",
    "samplers",
]
OPTIONAL = ["mlflow", "wandb", "tensorboard", "tensorboardX", "tensorflow"]
MODALITIES = [
    "dew.diffusion",
    "dew.sampling",
    "dew.networks",
    "dew.encoding",
    "dew.scoring",
    "dew.data.sources",
    "dew.objectives.diffusion",
]


def run_fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not SEED.exists(), reason="seed text not beside this checkout")
def test_seed_table_matches_the_list_checked_here():
    text = SEED.read_text()
    table = text.split("Name\tSummary", 1)[1].split("\nCheckpoints\n", 1)[0]
    names = [line.split("\t", 1)[0] for line in table.strip().splitlines() if "\t" in line]
    assert sorted(names) == sorted(SEED_NAMES)


def test_every_seed_name_resolves_after_bare_import():
    result = run_fresh(
        "import json, dew\n"
        f"names = {SEED_NAMES!r}\n"
        "missing = [n for n in names if getattr(dew, n, None) is None]\n"
        "print(json.dumps({'missing': missing, 'all': sorted(dew.__all__)}))"
    )
    assert result["missing"] == []
    assert set(SEED_NAMES) <= set(result["all"])


def test_registries_resolve_names_after_bare_import():
    result = run_fresh(
        "import json, dew\n"
        "print(json.dumps({'edm': dew.presets.EDM.sigma_data, 'unet': dew.models['unet'].__name__,"
        " 'digits': 'digits' in dew.datasets, 'heun': 'heun' in dew.samplers}))"
    )
    assert result == {"edm": 0.5, "unet": "UNet", "digits": True, "heun": True}


def test_import_dew_opens_no_backend_and_loads_no_optional_dependency():
    result = run_fresh(
        "import json, sys, dew, dew.registry\n"
        f"optional = {OPTIONAL!r}\n"
        "filled = sum(len(r._entries) for r in (dew.registry.models, dew.registry.presets))\n"
        "loaded = [m for m in optional if m in sys.modules]\n"
        "print(json.dumps({'jax': 'jax' in sys.modules, 'optional': loaded, 'filled': filled}))"
    )
    assert result == {"jax": False, "optional": [], "filled": 0}


def test_import_dew_training_stays_in_the_training_layer():
    result = run_fresh(
        "import json, sys, importlib, pkgutil, dew.training\n"
        "for m in pkgutil.iter_modules(dew.training.__path__):\n"
        "    importlib.import_module('dew.training.' + m.name)\n"
        "from jax._src import xla_bridge\n"
        f"forbidden = {MODALITIES + OPTIONAL!r}\n"
        "bad = [m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in forbidden)]\n"
        "print(json.dumps({'bad': bad, 'backends': list(xla_bridge._backends)}))"
    )
    assert result == {"bad": [], "backends": []}


def test_pipeline_is_built_and_refuses_a_source_that_is_not_a_run(tmp_path):
    import dew
    from dew.inference import PipelineError

    with pytest.raises(PipelineError, match=r"is not a dew run: no run\.json"):
        dew.pipeline(str(tmp_path))
