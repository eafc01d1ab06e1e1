"""``python -m dew.fid``'s flags become each mode's settings (``dew.fid.protocol.protocol_run``,
``dew.fid.reference.reference_job``): every ``--preset`` flag reaches ``ProtocolRun``, and ADM's
scorer reads the Inception weights once, keeping the digest the protocol's detector records."""

from __future__ import annotations

import dataclasses

import numpy as np

from dew.fid.cli import protocol_args, ref_args
from dew.fid.inputs import Weights
from dew.fid.protocol import ProtocolRun, protocol_run
from dew.fid.reference import reference_job


def test_every_preset_flag_reaches_the_protocols_settings(tmp_path):
    given = {
        "workdir": "runs/x",
        "preset": "cifar10",
        "ref": "ref.npz",
        "outdir": str(tmp_path / "out"),
        "num": 5000,
        "first_seed": 7,
        "batch": 16,
        "chunk": 500,
        "max_chunks": 3,
        "preview": 9,
        "step": 1200,
        "pr_arithmetic": "float32",
        "metrics": "fid,sfid,is",
        "weights": "w.npz",
        "image_handling": "tf1",
    }  # every value differs from its default, so a flag dropped on the way reads as its default
    switches = ["--raw", "--distributed", "--allow_unpinned_weights"]
    run = protocol_run(protocol_args([f"--{k}={v}" for k, v in given.items()] + switches))
    assert run.metrics == ("fid", "sfid", "is")
    assert run.weights == Weights("w.npz", pinned=False, handling="tf1")
    assert run.raw and run.distributed
    plain = {f.name for f in dataclasses.fields(ProtocolRun)} - {"metrics", "weights", "raw", "distributed"}
    assert plain == set(given) - {"metrics", "weights", "image_handling"}
    for name in plain:
        assert str(getattr(run, name)) == str(given[name]), name


def test_the_preset_parser_refuses_what_its_flags_alone_show(tmp_path):
    """No run, reference or weights exists here: the parser refuses an unknown preset, ADM's suite
    at another image handling and a folder as ADM's reference batch from the flags alone."""
    import pytest

    from dew.fid.inputs import FidError
    from dew.scoring.images import FidInputError

    ok = [f"--workdir={tmp_path / 'no_run'}", "--preset=cifar10", f"--outdir={tmp_path / 'out'}"]
    adm = ["--metrics=fid,sfid"]
    cases = [
        (["--preset=cifar100", "--ref=r.npz"], r"^--preset='cifar100' is not a sampler preset"),
        (["--ref=r.npz", *adm, "--image_handling=pytorch_fid"], r"^--image_handling=pytorch_fid does not"),
        ([f"--ref={tmp_path}", *adm], r"is a folder; the protocol takes an ADM reference batch \.npz$"),
    ]
    for change, message in cases:
        flags = {a.split("=")[0]: a for a in ok + change}
        with pytest.raises((FidError, FidInputError), match=message):
            protocol_args(list(flags.values()))
    assert protocol_args([*ok, f"--ref={tmp_path}"]).metrics == ("fid",)  # FID's folder: the mode's to read
    assert not (tmp_path / "out").exists()


def test_ref_flags_become_the_reference_job():
    argv = ["--data=d.zip", "--dest=o.npz", "--batch=3", "--image_handling=pytorch_fid"]
    job = reference_job(ref_args(argv))
    assert (job.data, job.dest, job.batch) == ("d.zip", "o.npz", 3)
    assert job.weights == Weights(None, pinned=True, handling="pytorch_fid")
    assert job.weights.flag == "the FID Inception weights" and Weights("w.npz").flag == "--weights"


def test_adm_scorer_reads_the_weights_once_and_keeps_their_digest(tmp_path, monkeypatch):
    from helpers_fid import random_state_dict

    from dew import pinned_weights
    from dew.npz import open_npz
    from dew.scoring import convert_inception
    from dew.scoring.adm_metrics import AdmScorer

    weights = str(tmp_path / "w.npz")
    convert_inception.convert(random_state_dict(), weights, "0" * 64)
    reads = []
    read_npz = pinned_weights.read_npz
    monkeypatch.setattr(pinned_weights, "read_npz", lambda *a: reads.append(a) or read_npz(*a))
    scorer = AdmScorer(weights, pinned=False)
    assert len(reads) == 1
    with open_npz(weights, "w") as data:
        assert scorer.digest == str(data["__content_sha256__"])
    np.testing.assert_array_equal(scorer.classifier, convert_inception.load_classifier(weights, pinned=False))


def test_the_fid_detector_reads_the_weights_once_and_records_their_digest(tmp_path, monkeypatch):
    from helpers_fid import random_state_dict

    from dew import npz
    from dew.npz import open_npz
    from dew.scoring import convert_inception
    from dew.scoring.fid_detector import inception_detector

    weights = str(tmp_path / "w.npz")
    convert_inception.convert(random_state_dict(), weights, "0" * 64)
    opened = []  # every archive dew.npz opens, whichever of its readers opened it
    real_open = npz._open
    monkeypatch.setattr(npz, "_open", lambda *a: opened.append(a) or real_open(*a))
    detector = inception_detector(weights, pinned=False, handling="tf1")
    assert len(opened) == 1
    with open_npz(weights, "w") as data:
        assert detector.description.endswith(f"weights sha256 {data['__content_sha256__']}")
