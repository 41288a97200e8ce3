"""Test trainer: gloo all_reduce steps that survive membership changes (no spotrun imports).

    allreduce_steps.py STATE_DIR [--steps N] [--step-time S] [--stuck-on-failure]

Prints `STEP <n> WORLD <w> RANK <r> NODE <node> T <unix time>` after every completed step (the
step counter is global: it resumes from STATE_DIR/step, written atomically by rank 0 each step).
Exits 75 (ask every agent to re-rendezvous) on any collective failure or when STATE_DIR/restart
exists (rank 0 removes it after the next rendezvous); exits 0 after step N. With
--stuck-on-failure it ignores SIGTERM and, instead of exiting on a collective failure, blocks
for ever: a worker hung in an NCCL collective whose peer died.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    state_dir = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 1_000_000
    step_time = float(sys.argv[sys.argv.index("--step-time") + 1]) if "--step-time" in sys.argv else 0.05
    step_file, flag = os.path.join(state_dir, "step"), os.path.join(state_dir, "restart")
    timeout = int(os.environ.get("SPOTRUN_COLLECTIVE_TIMEOUT_S", "60"))
    stuck_on_failure = "--stuck-on-failure" in sys.argv
    if stuck_on_failure:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
        try:
            with open(step_file) as f:
                step = int(f.read())
        except (OSError, ValueError):
            step = 0
        t = torch.tensor([step], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # agree on where to resume
        step = int(t.item())
        if rank == 0 and os.path.exists(flag):
            os.unlink(flag)
        dist.barrier()
        node = os.environ.get("SPOTRUN_NODE", "?")
        while step < steps:
            x = torch.ones(1000)
            dist.all_reduce(x)
            stop = torch.tensor([1 if os.path.exists(flag) else 0])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                os._exit(75)
            step += 1
            if rank == 0:
                tmp = f"{step_file}.tmp"
                with open(tmp, "w") as f:
                    f.write(str(step))
                os.replace(tmp, step_file)
            print(f"STEP {step} WORLD {world} RANK {rank} NODE {node} T {time.time():.3f}", flush=True)
            time.sleep(step_time)
    except Exception as exc:
        if stuck_on_failure:
            print(f"WORKER STUCK {type(exc).__name__}", flush=True)
            while True:
                time.sleep(60)
        print(f"WORKER EXIT 75 {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        os._exit(75)
    print(f"DONE {step} WORLD {world} RANK {rank}", flush=True)
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
