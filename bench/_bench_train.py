"""The benches' training job: the quickstart model, one timestamped line per step.

Copied by bench/recovery.py and bench/goodput.py into their temp workdir as `train.py`, next to
`quickstart_model.py` (a copy of recipes/quickstart/train.py) and `data.pt` (the quickstart's
generated images, made once by the bench so no worker spends its start-up drawing them).
Global rank 0 writes, flushed:

    BOOT WORLD <w> T0 <script start> T1 <trainer ready> RESUMED <step|None>   once per worker start
    STEP <n> WORLD <w> T <time.time()>                                        every step

and every rank writes, once per worker start, where its start-up time went:

    RANK <r> T0 <script start> TD <data loaded> T1 <trainer ready: process group, DDP, resume>

to stdout, or with $STEPS_LOG_DIR set, appended to $STEPS_LOG_DIR/<node>.log (the cluster's
shared directory: the lines outlive the VM; one rank per node).

Each step sleeps `--delay` s of emulated accelerator time. With `--ref-world N` a node sleeps in
proportion to its share of the global batch instead (`--delay` at world N, 1.5x that at world 2
when N is 3): the benches' VMs share two CPU cores, so real compute cannot show that fewer nodes
make each step slower; the sleep does, and time at a reduced world size costs as it would.

`--plain` is the baselines' script: periodic checkpoints only. A collective that fails because a
peer died is an ordinary error (exit 1) instead of the trainer's emergency save, so a relaunch
resumes from the newest periodic checkpoint, as a plain training script would.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TextIO  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart_model import make_model  # noqa: E402

from spotrun.elastic.trainer import ElasticTrainer  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--delay", type=float, default=0.03, help="emulated accelerator seconds per step")
    parser.add_argument(
        "--ref-world",
        type=int,
        default=0,
        help="world size at which a step sleeps --delay; others sleep in proportion to their "
        "share of the global batch (0: every step sleeps --delay)",
    )
    parser.add_argument("--plain", action="store_true", help="baseline: no emergency save")
    return parser


def _open_log() -> TextIO:
    folder = os.environ.get("STEPS_LOG_DIR")
    if not folder:
        return sys.stdout
    Path(folder).mkdir(parents=True, exist_ok=True)
    return open(Path(folder) / f"{os.environ.get('SPOTRUN_NODE_ID', 'node')}.log", "a")


def _write(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


def main() -> None:
    args = _parser().parse_args()
    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    images, labels = torch.load(os.path.join(here, "data.pt"))
    t_data = time.time()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    trainer = ElasticTrainer(model, optimizer, total_steps=args.steps, global_batch=args.batch, dataset_len=len(labels))
    out = _open_log()
    _write(out, f"RANK {trainer.rank} T0 {T0:.6f} TD {t_data:.6f} T1 {time.time():.6f}")
    rank0 = trainer.rank == 0
    if rank0:
        _write(out, f"BOOT WORLD {trainer.world_size} T0 {T0:.6f} T1 {time.time():.6f} RESUMED {trainer.resumed_from}")
    with trainer:
        try:
            for step, idx in trainer.batches():
                loss = loss_fn(trainer.model(images[idx]), labels[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if rank0:
                    _write(out, f"STEP {step} WORLD {trainer.world_size} T {time.time():.6f}")
                trainer.step_done(loss.item())
                share = len(idx) * args.ref_world / args.batch if args.ref_world else 1.0
                time.sleep(args.delay * share)
        except Exception as exc:
            if not args.plain:
                raise  # the trainer's __exit__: emergency save of the completed step, then re-form
            # os._exit: a normal exit runs gloo/DDP destructors that can hang on a dead peer.
            sys.stderr.write(f"training failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}\n")
            sys.stderr.flush()
            os._exit(1)


if __name__ == "__main__":
    main()
