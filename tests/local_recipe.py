"""The one recipe of a local-provider cluster that tests and benches write (bench/ imports it
through bench/_shared.py; tests never import bench/).

One candidate, `local` `cpu-small` at the given prices (with `workers` training workers per VM
when given), `nodes.min` 1, the work dir `work`, and
`control_plane` external at `endpoint` when one is given (else the embedded etcd). Every other
top-level recipe key (setup, env, checkpoint, budget, chaos, control_plane, ...) is passed as a
keyword with its plain value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# The env of the step-logging training scripts (tests/trainer_scripts/steps.py, bench/_bench_train.py):
# one torch thread, and their lines appended to the cluster's shared dir, where they outlive the VM.
SHARED_STEPS_ENV = {"OMP_NUM_THREADS": 1, "STEPS_LOG_DIR": "/run/spotrun/shared/steps"}


def local_recipe(
    name: str,
    *,
    target: int,
    max_nodes: int = 4,
    spares: int | None = None,
    spot: float = 0.10,
    on_demand: float = 0.40,
    boot_s: float | None = None,
    workers: int | None = None,
    workdir: str | Path = "work",
    run: str = "python train.py",
    endpoint: str | None = None,
    **sections: Any,
) -> str:
    """The recipe's YAML text."""
    resource: dict[str, Any] = {
        "provider": "local",
        "instance_type": "cpu-small",
        "prices": {"spot": spot, "on_demand": on_demand},
    }
    if boot_s is not None:
        resource["boot_s"] = boot_s
    if workers is not None:
        resource["workers"] = workers
    nodes: dict[str, Any] = {"min": 1, "max": max_nodes, "target": target}
    if spares is not None:
        nodes["spares"] = spares
    recipe: dict[str, Any] = {
        "name": name,
        "resources": [resource],
        "nodes": nodes,
        "workdir": str(workdir),
        "run": run,
    }
    recipe.update(sections)
    if endpoint is not None:
        recipe["control_plane"] = {"mode": "external", "endpoints": [endpoint]}
    return yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None, width=10**6)
