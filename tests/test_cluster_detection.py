"""A cluster that JAX detects but that cannot answer never stops a run: one line, one process.

The lent single-chip TPU VM sets ``TPU_WORKER_HOSTNAMES`` and has no metadata server, so JAX's
GKE TPU cluster reports itself present and its process count asks the server for the slice
count. These tests drive JAX's own cluster classes on this CPU machine with that environment.
"""

from __future__ import annotations

import time

import pytest
from jax._src.clusters import cloud_tpu_cluster

from dew.runtime import cluster_detection, distributed


@pytest.fixture
def tpu_vm(monkeypatch):
    """This process as JAX sees a Cloud TPU VM: the flag libtpu's start sets, no metadata server
    (a closed port on the loopback answers at once), no dew or cluster variables."""
    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "true")
    for name in (*distributed.ENVIRONMENT, "MEGASCALE_NUM_SLICES", "TPU_PROCESS_ADDRESSES", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    for name in ("OMPI_MCA_orte_hnp_uri", "PMIX_SERVER_URI2", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_single_host_tpu_vm_is_one_process_without_asking_the_metadata_server(tpu_vm, capsys):
    tpu_vm.setenv("TPU_WORKER_HOSTNAMES", "localhost")

    def asked(key):
        raise AssertionError(f"the metadata server was asked for {key}")

    tpu_vm.setattr(cloud_tpu_cluster, "get_metadata", asked)
    assert distributed.requested(initialization_timeout=5) is None
    assert capsys.readouterr().out == ""


def test_a_tpu_cluster_whose_metadata_cannot_be_reached_runs_as_one_process_with_one_line(tpu_vm, capsys):
    tpu_vm.setenv("TPU_WORKER_HOSTNAMES", "host-a,host-b")  # two workers: the slice count is asked
    began = time.monotonic()
    assert distributed.requested(initialization_timeout=5) is None
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, out
    assert out[0].startswith("dew: the gketpu cluster could not say how many processes this job has (")
    assert "ConnectionError" in out[0] and out[0].endswith("to join a group)")
    assert time.monotonic() - began < cluster_detection.DETECTION_SECONDS


def test_explicit_values_join_a_group_without_detection(tpu_vm):
    tpu_vm.setenv("TPU_WORKER_HOSTNAMES", "host-a,host-b")
    group = distributed.requested("127.0.0.1:1234", "2", "1", initialization_timeout=5)
    assert group is not None and (group.num_processes, group.process_id, group.origin) == (2, 1, "flags")


class _Hanging:
    name = "hanging"
    opt_in_only_method = False

    @classmethod
    def is_env_present(cls) -> bool:
        return True

    @classmethod
    def get_process_count(cls) -> int:
        time.sleep(30)
        return 2


class _Absent(_Hanging):
    name = "absent"

    @classmethod
    def is_env_present(cls) -> bool:
        return False


class _Four(_Hanging):
    name = "four"

    @classmethod
    def get_process_count(cls) -> int:
        return 4

    @classmethod
    def get_process_id(cls) -> int:
        return 3

    @classmethod
    def get_coordinator_address(cls, timeout_secs, override_coordinator_port) -> str:
        return f"10.0.0.1:{override_coordinator_port or 8476}"


def test_a_cluster_that_does_not_answer_in_time_is_one_line_and_one_process():
    began = time.monotonic()
    detection = cluster_detection.detect(5, {}, seconds=0.2, cluster_types=[_Absent, _Hanging])
    assert detection.group is None
    assert detection.note is not None and "the hanging cluster could not say" in detection.note
    assert "TimeoutError: no answer within 0.2 s" in detection.note
    assert time.monotonic() - began < 5


def test_a_cluster_that_answers_gives_its_group():
    detection = cluster_detection.detect(5, {"JAX_COORDINATOR_PORT": "1234"}, cluster_types=[_Absent, _Four])
    assert detection.note is None
    assert detection.group == cluster_detection.Detected("four", 4, 3, "10.0.0.1:1234", None)


@pytest.mark.parametrize(
    ("environ", "single"),
    [
        ({"TPU_WORKER_HOSTNAMES": "localhost"}, True),
        ({"TPU_WORKER_HOSTNAMES": "a,b"}, False),
        ({"TPU_WORKER_HOSTNAMES": "localhost", "MEGASCALE_NUM_SLICES": "2"}, False),
        ({"TPU_PROCESS_ADDRESSES": "10.0.0.2:8476", "TPU_WORKER_HOSTNAMES": "a,b"}, True),
        ({}, False),
    ],
)
def test_single_tpu_host_reads_the_workers_and_the_slice_count(environ, single):
    assert cluster_detection.single_tpu_host(environ) is single
