"""The recovery bench's training job: the quickstart model, one timestamped line per step.

Copied by bench/recovery.py into its temp workdir next to `quickstart_model.py` (a copy of
recipes/quickstart/train.py) and `data.pt` (the quickstart's generated images, made once by the
bench so no worker spends its start-up drawing them). Global rank 0 prints, flushed:

    BOOT WORLD <w> T0 <script start> T1 <trainer ready> RESUMED <step|None>   once per worker start
    STEP <n> WORLD <w> T <time.time()>                                        every step

`--plain` is the baseline: a script with periodic checkpoints only. A failed collective is
re-raised as an ordinary error (exit 1) instead of going through the trainer's emergency save.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart_model import make_model  # noqa: E402

from spotrun.elastic.trainer import ElasticTrainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--delay", type=float, default=0.03, help="seconds of sleep per step")
    parser.add_argument("--plain", action="store_true", help="baseline: no emergency save")
    args = parser.parse_args()

    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    images, labels = torch.load(os.path.join(here, "data.pt"))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    trainer = ElasticTrainer(model, optimizer, total_steps=args.steps, global_batch=args.batch,
                             dataset_len=len(labels))
    if trainer.rank == 0:
        print(f"BOOT WORLD {trainer.world_size} T0 {T0:.6f} T1 {time.time():.6f} RESUMED {trainer.resumed_from}",
              flush=True)
    with trainer:
        try:
            for step, idx in trainer.batches():
                loss = loss_fn(trainer.model(images[idx]), labels[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if trainer.rank == 0:
                    print(f"STEP {step} WORLD {trainer.world_size} T {time.time():.6f}", flush=True)
                trainer.step_done(loss.item())
                time.sleep(args.delay)
        except Exception:
            if not args.plain:
                raise
            traceback.print_exc()
            sys.stderr.flush()
            raise SystemExit(1)


if __name__ == "__main__":
    main()
