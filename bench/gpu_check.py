"""GPU check: one VM, one worker on the GPU, through spotrun's own trainer, as a user's script runs.

For each of DDP and FSDP2 it runs two real worker processes one after the other, each with the
environment torchrun gives a worker of a one-worker job (rank 0, world 1, LOCAL_RANK 0), so the
worker's own exit code is what the node agent's launcher would see:

  1. train: the worker must sit on `cuda:0` in a process group whose backend is
     `cpu:gloo,cuda:nccl`; it trains with a periodic checkpoint every 5 steps (staged to host
     memory, written in the background); at step 12 the "agent" (this script, through the
     control file, as the node agent does on a notice) asks for a checkpoint now: the worker must
     save at that step boundary and exit 75 (re-form);
  2. resume: a fresh worker must resume from step 12, on the GPU again, and train to step 20.

A third run, `ddp+memory`, gives both workers the node's host-memory directory as the node agent
does (live recovery): the agreed step must go to host memory (the arena, copied from the GPU)
instead of storage, and the fresh worker must resume from it onto the GPU.

It prints one JSON line per check (`"ok": true/false`) and a summary line, and exits 1 when a
check failed, 2 when there is no CUDA device (nothing verified; `--allow-cpu` runs the same checks
on the CPU over gloo, to exercise this script where no GPU is lent).

Run: .venv/bin/python bench/gpu_check.py [--allow-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

TOTAL_STEPS = 20
AGREED_AT = 12
EVERY = 5


def _worker(mode: str, phase: str, out: Path) -> int:
    """One training worker (run by torch.distributed.run); writes what it saw to `out`."""
    import torch
    import torch.distributed as dist

    from spotrun.elastic.trainer import ElasticTrainer
    from spotrun.node.protocol import ControlCommand, ControlWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    x, y = torch.randn(512, 64), torch.randn(512, 8)
    seen: dict[str, object] = {"mode": mode, "phase": phase}
    with ElasticTrainer(
        model,
        lambda params: torch.optim.AdamW(params, lr=1e-3),
        parallel="fsdp" if mode == "fsdp" else "ddp",
        total_steps=TOTAL_STEPS,
        global_batch=32,
        dataset_len=len(x),
        every_steps=EVERY,
    ) as t:
        seen.update(
            device=str(t.device),
            backend=str(dist.get_backend()),
            resumed_from=t.resumed_from,
            params_on=sorted({str(p.device) for p in t.model.parameters()}),
        )
        out.write_text(json.dumps(seen))
        for step, idx in t.batches():
            loss = torch.nn.functional.mse_loss(t.model(x[idx].to(t.device)), y[idx].to(t.device))
            t.optimizer.zero_grad()
            loss.backward()
            t.optimizer.step()
            t.step_done(loss.item())
            seen["last_step"] = step
            out.write_text(json.dumps(seen))
            if phase == "train" and step == AGREED_AT - 1:  # steps are 1-based
                # What the node agent does on a notice: ask for a checkpoint at the next step boundary.
                ControlWriter(Path(os.environ["SPOTRUN_CONTROL_FILE"])).request(ControlCommand.LEAVE, "gpu-check")
    return 0


def _run(mode: str, phase: str, work: Path) -> tuple[int, dict[str, object]]:
    out = work / f"{mode}-{phase}.json"
    env = {
        **os.environ,
        "SPOTRUN_CHECKPOINT_DIR": str(work / f"ckpt-{mode}"),
        "SPOTRUN_CONTROL_FILE": str(work / f"control-{mode}"),
        "OMP_NUM_THREADS": "1",
    }
    if mode == "ddp+memory":
        env["SPOTRUN_MEMORY_DIR"] = str(work / "memory")
    with socket.socket() as probe:  # a free port for the group's TCPStore
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
    argv = [sys.executable, __file__, "--worker", mode, phase, str(out)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    seen = json.loads(out.read_text()) if out.exists() else {}
    if proc.returncode not in (0, 75):
        seen["stderr_tail"] = proc.stderr[-1500:]
    return proc.returncode, seen


def _checks(mode: str, want_device: str, want_backend: str, work: Path) -> list[dict[str, object]]:
    rc, train = _run(mode, "train", work)
    ckpts = sorted(p.name for p in (work / f"ckpt-{mode}").glob("step-*"))
    memory_steps = sorted(p.name for p in (work / "memory").glob("step-*"))
    rc2, resume = _run(mode, "resume", work)
    on_disk = f"step-{AGREED_AT:09d}" in ckpts
    rows = [
        ("device", train.get("device") == want_device, train.get("device")),
        ("parameters on the device", train.get("params_on") == [want_device], train.get("params_on")),
        ("process group backend", train.get("backend") == want_backend, train.get("backend")),
        ("periodic checkpoint written", f"step-{EVERY:09d}" in ckpts, ckpts),
        ("agreed checkpoint, exit 75", rc == 75 and train.get("last_step") == AGREED_AT - 1, rc),
        *(
            [
                (
                    "agreed step in host memory, not on disk",
                    memory_steps == [f"step-{AGREED_AT:09d}.pt"] and not on_disk,
                    memory_steps,
                )
            ]
            if mode == "ddp+memory"
            else [("agreed checkpoint on disk", on_disk, ckpts)]
        ),
        ("resume from the agreed step", resume.get("resumed_from") == AGREED_AT, resume.get("resumed_from")),
        ("resume trains to the end", rc2 == 0 and resume.get("last_step") == TOTAL_STEPS, rc2),
    ]
    out = [{"bench": "gpu_check", "mode": mode, "check": name, "ok": bool(ok), "seen": seen} for name, ok, seen in rows]
    for phase, seen in (("train", train), ("resume", resume)):
        if "stderr_tail" in seen:
            out.append({"bench": "gpu_check", "mode": mode, "phase": phase, "stderr_tail": seen["stderr_tail"]})
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return _worker(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="without CUDA, run the same checks on the CPU")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(json.dumps({"bench": "gpu_check", "ok": False, "verified": "nothing: no CUDA device on this machine"}))
        return 2
    device, backend = ("cuda:0", "cpu:gloo,cuda:nccl") if cuda else ("cpu", "gloo")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="spotrun-gpu-check-") as tmp:
        for mode in ("ddp", "fsdp", "ddp+memory"):
            work = Path(tmp) / mode
            work.mkdir()
            rows += _checks(mode, device, backend, work)
    for row in rows:
        print(json.dumps(row))
    failed = [r for r in rows if r.get("ok") is False]
    gpu = torch.cuda.get_device_name(0) if cuda else "none (CPU run)"
    checks = sum("check" in r for r in rows)
    summary = {"bench": "gpu_check", "gpu": gpu, "torch": torch.__version__, "checks": checks, "failed": len(failed)}
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
