"""Which device a training worker computes on, and which process-group backend it uses.

One worker per accelerator: torch elastic gives each worker of a VM its LOCAL_RANK, and on a
machine with CUDA that worker drives `cuda:LOCAL_RANK`; without CUDA it runs on the CPU. The
backend follows the device: `cpu:gloo,cuda:nccl` on CUDA (NCCL for the model's CUDA tensors; the
trainer's small control collectives, such as the agreed-checkpoint flag, stay on CPU tensors and
go through gloo), plain `gloo` on CPU.

Import-light: torch is imported inside `select` (or its `cuda` module passed in), so the decision
itself (`choose`) is plain Python that tests check without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from spotrun.errors import SpotrunError

__all__ = ["CPU_BACKEND", "CUDA_BACKEND", "NCCL_ENV", "DeviceError", "WorkerDevice", "choose", "select"]

CPU_BACKEND = "gloo"
CUDA_BACKEND = "cpu:gloo,cuda:nccl"
# Set before an NCCL group is made. With async error handling NCCL's watchdog aborts a collective
# that outlived the group's timeout (a peer died) and ends the process, instead of leaving it blocked
# for ever; blocking wait stays off so that the watchdog, not the training thread, does the waiting.
NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"}


class DeviceError(SpotrunError):
    """This worker has no device of its own (more workers on the VM than CUDA devices)."""


@dataclass(frozen=True)
class WorkerDevice:
    """Where one worker computes: CUDA device `index`, or the CPU when `index` is None."""

    index: int | None = None

    @property
    def name(self) -> str:
        """The torch device string: "cuda:3" or "cpu"."""
        return "cpu" if self.index is None else f"cuda:{self.index}"

    @property
    def is_cuda(self) -> bool:
        return self.index is not None

    @property
    def backend(self) -> str:
        """The process-group backend for `init_process_group`."""
        return CUDA_BACKEND if self.is_cuda else CPU_BACKEND

    @property
    def ddp_device_ids(self) -> list[int] | None:
        """DistributedDataParallel's `device_ids`: this worker's one GPU, or None on CPU."""
        return None if self.index is None else [self.index]


def choose(local_rank: int, cuda_available: bool, device_count: int) -> WorkerDevice:
    """The device of the worker with `local_rank` on a machine with `device_count` CUDA devices
    (ignored when CUDA is not available). Pure. Raises DeviceError when CUDA is available but
    `local_rank` has no device of its own."""
    if not cuda_available:
        return WorkerDevice()
    if not 0 <= local_rank < device_count:
        raise DeviceError(
            f"LOCAL_RANK {local_rank} has no GPU: this VM has {device_count} CUDA device(s)",
            hint=f"set `workers` of this resource candidate in the recipe to at most {device_count}",
        )
    return WorkerDevice(local_rank)


def select(cuda: Any = None, env: MutableMapping[str, str] | None = None) -> WorkerDevice:
    """Choose this worker's device from LOCAL_RANK in `env` (default os.environ) and what `cuda`
    (default torch.cuda) reports; on CUDA pin the worker to its device and set NCCL_ENV in `env`,
    so call it before `init_process_group`. Idempotent. Raises DeviceError (see `choose`)."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    env = os.environ if env is None else env
    available = bool(cuda.is_available())
    device = choose(int(env.get("LOCAL_RANK") or 0), available, cuda.device_count() if available else 0)
    if device.index is not None:
        cuda.set_device(device.index)
        env.update(NCCL_ENV)
    return device
