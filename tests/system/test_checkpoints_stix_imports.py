"""The stix API's import contract, each in a fresh interpreter: ``import dew`` and a run load no
pydantic (naming a stix config does), and the stix names resolve from ``dew.training`` without a
modality or tracker backend. (The stix API itself: tests/test_checkpoints_stix.py.)"""

from __future__ import annotations

import json


def test_import_dew_and_a_run_load_no_pydantic_and_naming_a_stix_config_does():
    import subprocess
    import sys

    code = (
        "import sys, dew, dew.training\n"
        "from dew.training import Trainer, Checkpoints\n"
        "before = 'pydantic' in sys.modules\n"
        "from dew.training import TrainingIOHandlerConfig\n"
        "print(before, 'pydantic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_stix_names_resolve_from_dew_training_without_a_modality_or_tracker_backend():
    import subprocess
    import sys

    names = [
        "TrainingIOHandler",
        "TrainingIOHandlerConfig",
        "Checkpointer",
        "CheckpointerConfig",
        "LoggingCategory",
        "CheckpointRestorationError",
        "save_run_metadata",
        "read_run_metadata",
        "get_debiased_ema",
        "log_metrics_to_line",
        "log_metrics_to_table",
        "convert_mse_to_rmse_in_logs",
    ]
    code = (
        "import sys, json, dew.training as t\n"
        f"[getattr(t, n) for n in {names!r}]\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlflow', 'wandb', 'tensorboard', 'tensorflow', 'haiku') or m.startswith(('dew.diffusion', "
        "'dew.sampling', 'dew.networks', 'dew.encoding', 'dew.scoring', 'dew.objectives.diffusion', "
        "'dew.data.digits')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
