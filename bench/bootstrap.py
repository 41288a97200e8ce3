"""Bootstrap: provision and bootstrap 1, 8 and 32 local VMs with `spotrun up`.

`spotrun` = seconds from the start of `up` (launch) until every agent has registered in etcd;
`baseline` = the same for one VM, measured in this run. Goal: t(32) <= 3 x t(1).
Run as root: .venv/bin/python bench/bootstrap.py [--counts 1,8,32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit
from _shared import local_recipe

from spotrun.controller.bootstrap import QuietReporter


def _one(count: int, root: Path, endpoint: str) -> float:
    from spotrun.client.down import down
    from spotrun.client.up import up

    recipe = root / f"bench{count}.yaml"
    (root / "work").mkdir(exist_ok=True)
    (root / "work" / "train.py").write_text("print('bench')\n")
    recipe.write_text(local_recipe(f"bench{count}", target=count, max_nodes=count, setup="true", endpoint=endpoint))
    start = time.perf_counter()
    try:
        result = up(recipe, train=False, reporter_factory=QuietReporter)
        took = time.perf_counter() - start
        assert len(result.nodes) == count, result
        return took
    finally:
        down(f"bench{count}", purge=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default="1,8,32")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    from spotrun.simulate.figures import figures_path, record_figures

    figures = figures_path()  # the user's, before SPOTRUN_HOME points at the temp dir
    with tempfile.TemporaryDirectory(prefix="spotrun-bench-") as tmp:
        os.environ["SPOTRUN_HOME"] = str(Path(tmp) / "home")
        from spotrun.state.etcd_server import EtcdProcess

        # The control plane runs before the clock starts: the bench times launch -> agents.
        with EtcdProcess(Path(tmp) / "etcd") as etcd:
            times = {count: _one(count, Path(tmp), etcd.endpoint) for count in counts}
    one = times.get(1)
    if one is not None:  # `spotrun simulate` reads it
        print(f"figures recorded in {record_figures({'bootstrap_s': round(one, 3)}, figures)}", file=sys.stderr)
    for count, took in times.items():
        extra = {"ratio_to_one": round(took / one, 2), "goal_ratio": 3.0} if one and count != 1 else {}
        emit("bootstrap", str(count), "s", took, one if count != 1 else None, **extra)


if __name__ == "__main__":
    main()
