"""Run metadata from outside the logs: --label flags and a scheduler's environment.

The environment is read only when asked (`--scheduler-env`, as the epilog recipes do):
an analysis started by hand inside some other job's allocation must not take that job's
id for the one it reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .errors import PostmortemError

# environment variable -> label
SCHEDULER_VARIABLES = {
    "SLURM_JOB_ID": "job_id",
    "SLURM_JOB_NAME": "job_name",
    "SLURM_JOB_USER": "user",
    "SLURM_JOB_NODELIST": "nodelist",
    "SLURM_NODELIST": "nodelist",
    "SLURM_CLUSTER_NAME": "cluster",
    "SLURM_JOB_PARTITION": "partition",
    "SLURMD_NODENAME": "node",  # the node an epilog runs on: its partition of a multi-node job
    "TORCHELASTIC_RUN_ID": "torchelastic_run_id",
    "PYTORCHJOB_NAME": "job_name",  # set from the PyTorchJob's name by our Kubernetes recipe
    "POD_NAMESPACE": "namespace",
}
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """`key=value` strings into a dict; a malformed one is a usage error."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _KEY.match(key.strip()):
            raise PostmortemError(f"--label takes key=value (a key of letters, digits, _ . -), not {pair!r}.")
        labels[key.strip()] = value.strip()
    return labels


def scheduler_labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    labels = {}
    for variable, label in SCHEDULER_VARIABLES.items():
        if env.get(variable):
            labels.setdefault(label, env[variable])
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("HOSTNAME"):
        labels.setdefault("pod", env["HOSTNAME"])
    return labels
