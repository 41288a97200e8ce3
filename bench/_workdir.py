"""The benches' job directory: the training script, the quickstart model and its data."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def make_data(path: Path, samples: int) -> None:
    """The quickstart's generated images, saved once so no worker spends its start-up drawing them."""
    sys.path.insert(0, str(ROOT / "recipes" / "quickstart"))
    import torch
    from train import make_data as quickstart_data

    torch.save(quickstart_data(samples), path)


def job_workdir(path: Path, data: Path) -> Path:
    """`path` with train.py (bench/_bench_train.py), quickstart_model.py and data.pt."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "_bench_train.py", path / "train.py")
    shutil.copy(ROOT / "recipes" / "quickstart" / "train.py", path / "quickstart_model.py")
    shutil.copy(data, path / "data.pt")
    return path
