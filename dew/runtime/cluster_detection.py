"""Which process group a cluster scheduler put this process in, as JAX's cluster classes see it.

JAX knows several schedulers (``jax._src.clusters``: SLURM, Open MPI, Cloud TPU on GCE and GKE,
Kubernetes). A class whose environment is present answers how many processes the job has and
which one this is. Some answers need a network service: a Cloud TPU class asks the VM's metadata
server for a value its environment lacks (the slice count, ``MEGASCALE_NUM_SLICES``), and on a
machine without one that ask fails after DNS and HTTP retries (a ``requests`` ``ConnectionError``
after ~80 s on a lent single-chip TPU VM that sets ``TPU_WORKER_HOSTNAMES`` but has no metadata
server).

Detection therefore never decides a run's fate by failing:

- a Cloud TPU host whose environment names one worker (``TPU_WORKER_HOSTNAMES`` or
  ``TPU_PROCESS_ADDRESSES``) and no slice count is one process, and no server is asked (a
  multislice job's environment sets ``MEGASCALE_NUM_SLICES``);
- any other question is asked in a thread bounded by ``DETECTION_SECONDS``; an exception or no
  answer in time is one line (``Detection.note``) and the run continues as one process.

An explicit group (``--coordinator/--num_processes/--process_id`` or the ``DEW_*`` variables,
``dew.runtime.distributed``) is never detected, so it always joins.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

#: How long one cluster class may take to say how many processes the job has.
DETECTION_SECONDS = 20.0
#: The environment variables in which a Cloud TPU VM names its slice's workers (GKE's, and a
#: lent VM's), and the one that names the slice count of a multislice job.
TPU_WORKER_VARIABLES = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")
TPU_SLICES_VARIABLE = "MEGASCALE_NUM_SLICES"


@dataclasses.dataclass(frozen=True)
class Detected:
    """What a cluster class said of a job of several processes: its name, the process count and
    this process's index, the coordinator address, and how many tasks the scheduler placed on
    this node (None: not said)."""

    cluster: str
    num_processes: int
    process_id: int
    coordinator: str
    tasks_on_node: int | None


@dataclasses.dataclass(frozen=True)
class Detection:
    """The outcome: ``group`` (None: one process) and ``note``, the one line a run prints when a
    cluster's question could not be answered and it runs as one process (None otherwise)."""

    group: Detected | None
    note: str | None = None


def tasks_on_this_node(environ: Mapping[str, str]) -> int | None:
    """How many tasks of the job a cluster scheduler placed on this node (None: not said)."""
    for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        found = re.match(r"\d+", environ.get(key, ""))
        if found:
            return int(found.group())
    local = environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    return int(local) if local.isdigit() else None


def single_tpu_host(environ: Mapping[str, str]) -> bool:
    """Whether the environment itself says this Cloud TPU VM is a whole job of one process: one
    worker named and no slice count (the lent single-host TPU VMs; a single-host GKE pod)."""
    if environ.get(TPU_SLICES_VARIABLE):
        return False
    for key in TPU_WORKER_VARIABLES:
        if key in environ:
            workers = [w for w in environ[key].split(",") if w.strip()]
            return len(workers) <= 1
    return False


def _bounded(question: Callable[[], Any], seconds: float) -> Any:
    """``question()``'s answer, asked in a daemon thread: its exception re-raised, or
    ``TimeoutError`` after ``seconds`` (the thread is left to end by itself)."""
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["value"] = question()
        except BaseException as e:  # handed to the caller as is
            answer["error"] = e

    thread = threading.Thread(target=ask, name="dew-cluster-detection", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


#: The answer of a cluster class whose environment is absent.
_ABSENT = "absent"


def _ask(env: Any, initialization_timeout: int, environ: Mapping[str, str]) -> Detected | str | None:
    """``env``'s group, None for one process, ``_ABSENT`` when its environment is not here."""
    if env.opt_in_only_method or not env.is_env_present():
        return _ABSENT
    name = getattr(env, "name", None) or env.__name__
    if name in ("gketpu", "gcetpu", "tpu") and single_tpu_host(environ):
        return None
    count = env.get_process_count()
    if count <= 1:
        return None
    coordinator = environ.get("JAX_COORDINATOR_ADDRESS") or env.get_coordinator_address(
        timeout_secs=initialization_timeout, override_coordinator_port=environ.get("JAX_COORDINATOR_PORT")
    )
    return Detected(name, count, env.get_process_id(), coordinator, tasks_on_this_node(environ))


def detect(
    initialization_timeout: int,
    environ: Mapping[str, str] | None = None,
    seconds: float = DETECTION_SECONDS,
    cluster_types: list[Any] | None = None,
) -> Detection:
    """The group of the first cluster JAX detects here (``cluster_types``: JAX's list), or none.
    A cluster class that raises or does not answer within ``seconds`` gives no group and a
    ``note`` naming it and its error: the run goes on as one process (module docstring)."""
    environ = os.environ if environ is None else environ
    if cluster_types is None:
        from jax._src import clusters

        cluster_types = list(clusters.ClusterEnv._cluster_types)
    for env in cluster_types:
        name = getattr(env, "name", None) or env.__name__
        try:
            answer = _bounded(lambda env=env: _ask(env, initialization_timeout, environ), seconds)
        except Exception as e:  # any failure of the question is reported, not raised
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            if len(reason) > 200:
                reason = reason[:197] + "..."
            return Detection(
                None,
                f"the {name} cluster could not say how many processes this job has ({reason}); "
                "running as one process (give --coordinator, --num_processes and "
                "--process_id, or the DEW_* variables, to join a group)",
            )
        if answer != _ABSENT:
            return Detection(answer if isinstance(answer, Detected) else None)
    return Detection(None)


__all__ = ["DETECTION_SECONDS", "Detected", "Detection", "detect", "single_tpu_host", "tasks_on_this_node"]
