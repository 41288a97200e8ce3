"""A tiny ElasticTrainer job for tests: prints `STEP <n> WORLD <w> RANK <r> T <time> LOSS <l> IDX <i,j,...>`
once per step on every rank, so a test can check that no step ran twice and no sample was skipped
or repeated, and time what happened when."""

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
from torch import nn

from spotrun.elastic.trainer import ElasticTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=12)
parser.add_argument("--samples", type=int, default=50)
parser.add_argument("--delay", type=float, default=0.05, help="seconds per step, so tests can act mid-run")
parser.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
parser.add_argument("--final", help="rank 0 writes the whole final model state here (torch.save)")
parser.add_argument("--momentum", type=float, default=0.0, help="DDP: SGD momentum (optimizer state to carry over)")
args = parser.parse_args()

torch.manual_seed(0)
if args.parallel == "fsdp":  # two layers, so FSDP2 shards more than the root
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)  # noqa: E731 (built after sharding)
else:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=args.momentum)
x = torch.randn(args.samples, 4, generator=torch.Generator().manual_seed(1))
y = x.sum(1, keepdim=True)
with contextlib.ExitStack() as files:
    steps_log = None
    if os.environ.get("STEPS_LOG_DIR"):
        Path(os.environ["STEPS_LOG_DIR"]).mkdir(parents=True, exist_ok=True)
        log_path = Path(os.environ["STEPS_LOG_DIR"]) / f"{os.environ.get('SPOTRUN_NODE_ID', 'node')}.log"
        steps_log = files.enter_context(open(log_path, "a"))
    t = files.enter_context(
        ElasticTrainer(
            model,
            optimizer,
            total_steps=args.steps,
            global_batch=args.batch,
            dataset_len=args.samples,
            parallel=args.parallel,
        )
    )
    for step, idx in t.batches():
        loss = ((t.model(x[idx].to(t.device)) - y[idx].to(t.device)) ** 2).mean()
        t.optimizer.zero_grad()
        loss.backward()
        t.optimizer.step()
        line = (
            f"STEP {step} WORLD {t.world_size} RANK {t.rank} T {time.time():.3f} LOSS {loss.item():.5f} "
            f"IDX {','.join(map(str, idx.tolist()))}"
        )
        print(line, flush=True)
        if steps_log is not None:  # survives the VM: tests read every node's steps after it is gone
            steps_log.write(line + "\n")
            steps_log.flush()
        t.step_done(loss.item())
        time.sleep(args.delay)
    if args.final:  # collective: every rank takes part in gathering the whole state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        final = get_model_state_dict(t.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if t.rank == 0:
            torch.save(final, args.final)
