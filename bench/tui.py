"""TUI CPU at 1000 workers: the real `spotrun.tui` app in a real terminal (tmux) watching a real etcd
while writer processes update every worker's progress (and some node states) at 2 Hz.

Prints one line per case: `spotrun` = the app process's CPU time / wall time over the measured window
(percent of one core), `peak_rss_mb` = its peak resident memory (VmHWM), `writes_per_s` = the update
rate the writers actually reached. Goal: under 25 % of one core.

Run: .venv/bin/python bench/tui.py [--workers 1000] [--hz 2] [--seconds 20] [--writers 4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _format import emit

from spotrun.state.etcd_server import EtcdProcess
from spotrun.state.records import EventKind, LedgerSegment, NodeRecord, NodeState, Progress
from spotrun.state.store import connect

CLUSTER = "bench-tui"
STATES = (NodeState.RUNNING, NodeState.RUNNING, NodeState.RUNNING, NodeState.NOTICE, NodeState.LEAVING)


def node(i: int, now: float, state: NodeState = NodeState.RUNNING) -> NodeRecord:
    return NodeRecord(
        f"w-{i:04d}",
        CLUSTER,
        "local",
        f"lo-{'abcd'[i % 4]}",
        "cpu-small",
        0.12,
        0.40,
        state=state,
        launched_at=now - 60 - i,
    )


def populate(endpoint: str, workers: int) -> None:
    now = time.time()
    with connect([endpoint]) as store:
        store.delete_cluster(CLUSTER)
        store.put_spec(
            CLUSTER,
            {
                "name": CLUSTER,
                "resources": [{"provider": "local", "instance_type": "cpu-small"}],
                "run": "python train.py --steps 1000000",
                "nodes": {"min": 1, "max": workers * 2, "target": workers},
                "checkpoint": {"every_steps": 500},
                "budget": {"max_total": 10000.0},
            },
        )
        store.set_target(CLUSTER, workers)
        for i in range(workers):
            store.put_node(node(i, now))
            store.put_progress(CLUSTER, Progress(f"w-{i:04d}", 0, 100.0, workers, now, 3.0))
            store.put_ledger(CLUSTER, f"w-{i:04d}", [LedgerSegment(f"w-{i:04d}", 0.12, 0.40, now - 60)])
        store.add_event(CLUSTER, EventKind.UP, f"cluster at {workers} nodes")


def writer(endpoint: str, ids: list[int], workers: int, hz: float, seconds: float, counts) -> None:
    """Update progress of `ids` at `hz` each (and one node state in 50 per round) for `seconds`."""
    period = 1.0 / hz
    writes = 0
    with connect([endpoint]) as store:
        start = time.monotonic()
        round_ = 0
        while time.monotonic() - start < seconds:
            now = time.time()
            for i in ids:
                store.put_progress(
                    CLUSTER,
                    Progress(
                        f"w-{i:04d}", round_ * 10 + i % 7, 100.0 + (i + round_) % 13, workers, now, 3.0 - round_ * 0.001
                    ),
                )
                writes += 1
                if (i + round_) % 50 == 0:
                    store.put_node(node(i, now, STATES[(i + round_) % len(STATES)]))
                    writes += 1
            round_ += 1
            wait = start + round_ * period - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    counts.put(writes)


def proc_stats(pid: int) -> tuple[float, float]:
    """(cpu seconds user+system, peak RSS in MB) of `pid` from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return cpu, peak


def app_pid(session: str) -> int:
    out = subprocess.run(
        ["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"], capture_output=True, text=True, check=True
    ).stdout.split()
    pid = int(out[0])
    # tmux may start the command under a shell: take its python child if there is one.
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return int(kids[0]) if kids else pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--hz", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--size", default="160x48", help="terminal size COLSxROWS")
    args = parser.parse_args()
    if not shutil.which("tmux"):
        sys.exit("bench/tui.py needs tmux (apt-get install tmux)")
    cols, rows = args.size.split("x")
    with tempfile.TemporaryDirectory() as tmp, EtcdProcess(Path(tmp) / "etcd") as etcd:
        populate(etcd.endpoint, args.workers)
        session = f"spotrun-bench-{uuid.uuid4().hex[:8]}"
        command = f"exec {sys.executable} -m spotrun.tui.app {CLUSTER} --endpoint {etcd.endpoint}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", cols, "-y", rows, command], check=True)
        try:
            deadline = time.monotonic() + 30
            while (
                "w-0000"
                not in subprocess.run(
                    ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout
            ):
                if time.monotonic() > deadline:
                    sys.exit("the TUI did not show the workers within 30 s")
                time.sleep(0.2)
            pid = app_pid(session)
            time.sleep(1.0)  # let start-up work settle
            counts: mp.Queue = mp.Queue()
            ids = list(range(args.workers))
            procs = [
                mp.Process(
                    target=writer,
                    args=(etcd.endpoint, ids[k :: args.writers], args.workers, args.hz, args.seconds, counts),
                )
                for k in range(args.writers)
            ]
            cpu0, _ = proc_stats(pid)
            t0 = time.monotonic()
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            wall = time.monotonic() - t0
            cpu1, peak = proc_stats(pid)
            writes = sum(counts.get() for _ in procs)
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if "disconnected" in screen or "w-0000" not in screen:
                sys.exit(f"the TUI was not showing live workers at the end:\n{screen}")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    emit(
        "tui",
        f"{args.workers} workers",
        "%",
        100.0 * (cpu1 - cpu0) / wall,
        peak_rss_mb=round(peak, 1),
        writes_per_s=round(writes / wall),
        target_writes_per_s=round(args.workers * args.hz),
        seconds=round(wall, 1),
        size=args.size,
        goal=25,
    )


if __name__ == "__main__":
    main()
