"""The goodput bench's training job: the quickstart model, a fixed number of steps.

Copied by bench/goodput.py into its temp workdir as `train.py`, next to `quickstart_model.py` (a
copy of recipes/quickstart/train.py) and `data.pt` (the quickstart's generated images, made once
by the bench). Global rank 0 appends one line per completed step to
$STEPS_LOG_DIR/<node>.log (the cluster's shared directory: the lines outlive the VM), flushed:

    BOOT WORLD <w> T0 <script start> T1 <trainer ready> RESUMED <step|None>   once per worker start
    STEP <n> WORLD <w> T <time.time()>                                        every step

and every rank (one per node) appends, once per worker start, where its start-up time went:

    RANK <r> T0 <script start> TD <data loaded> T1 <trainer ready: process group, DDP, resume>

Each step also sleeps `--delay` x (this node's share of the global batch) x `--ref-world`: the
time a node's own accelerator would spend on its share. The bench's VMs share two CPU cores, so
real compute cannot show that fewer nodes make each step slower; the sleep does (a step at world
2 sleeps 1.5x as long as at world 3), and time at a reduced world size costs goodput as it would.

`--plain` is the relaunch-all baseline's script: periodic checkpoints only. A collective that
fails because a peer died is an ordinary error (exit 1) instead of the trainer's emergency save,
so a relaunch resumes from the newest periodic checkpoint, as a plain training script would.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart_model import make_model  # noqa: E402

from spotrun.elastic.trainer import ElasticTrainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--delay", type=float, default=0.03,
                        help="emulated accelerator seconds per step at --ref-world nodes; each node sleeps in "
                             "proportion to its share of the global batch (a step at world 2 takes 1.5x world 3's)")
    parser.add_argument("--ref-world", type=int, default=3, help="world size at which a step sleeps --delay")
    parser.add_argument("--plain", action="store_true", help="baseline: no emergency save")
    args = parser.parse_args()

    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    images, labels = torch.load(os.path.join(here, "data.pt"))
    t_data = time.time()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    trainer = ElasticTrainer(model, optimizer, total_steps=args.steps, global_batch=args.batch,
                             dataset_len=len(labels))
    folder = Path(os.environ.get("STEPS_LOG_DIR", here))
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{os.environ.get('SPOTRUN_NODE_ID', 'node')}.log"  # one rank per node
    with open(log, "a") as f:
        f.write(f"RANK {trainer.rank} T0 {T0:.6f} TD {t_data:.6f} T1 {time.time():.6f}\n")
    out = None
    if trainer.rank == 0:
        out = open(log, "a")
        out.write(f"BOOT WORLD {trainer.world_size} T0 {T0:.6f} T1 {time.time():.6f} RESUMED {trainer.resumed_from}\n")
        out.flush()
    with trainer:
        try:
            for step, idx in trainer.batches():
                loss = loss_fn(trainer.model(images[idx]), labels[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if out is not None:
                    out.write(f"STEP {step} WORLD {trainer.world_size} T {time.time():.6f}\n")
                    out.flush()
                trainer.step_done(loss.item())
                time.sleep(args.delay * len(idx) * args.ref_world / args.batch)
        except Exception as exc:
            if not args.plain:
                raise  # the trainer's __exit__: emergency save of the completed step, then re-form
            # os._exit: a normal exit runs gloo/DDP destructors that can hang on a dead peer.
            sys.stderr.write(f"training failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}\n")
            sys.stderr.flush()
            os._exit(1)


if __name__ == "__main__":
    main()
