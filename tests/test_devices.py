"""Device and backend selection for training workers, for CUDA and CPU machines, without a GPU."""

from __future__ import annotations

import pytest

from spotrun.elastic import devices
from spotrun.elastic.devices import DeviceError, WorkerDevice, choose, select


class FakeCuda:
    """What `select` asks of torch.cuda: the availability and count are the test's."""

    def __init__(self, available: bool, count: int) -> None:
        self.available, self.count = available, count
        self.current: int | None = None

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.current = index


@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_cuda_worker_drives_the_gpu_of_its_local_rank_over_nccl(local_rank: int) -> None:
    cuda, env = FakeCuda(True, 8), {"LOCAL_RANK": str(local_rank)}
    device = select(cuda, env)
    assert device == WorkerDevice(local_rank)
    assert (device.name, device.ddp_device_ids, cuda.current) == (f"cuda:{local_rank}", [local_rank], local_rank)
    # One group, both backends: CUDA tensors through NCCL, the CPU control flag through gloo.
    assert device.backend == "cpu:gloo,cuda:nccl"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_BLOCKING_WAIT"] == "0"


@pytest.mark.parametrize(("available", "count"), [(False, 0), (False, 4)])
def test_cpu_worker_uses_gloo_and_sets_no_nccl_variables(available: bool, count: int) -> None:
    cuda, env = FakeCuda(available, count), {"LOCAL_RANK": "1"}
    device = select(cuda, env)
    assert (device.name, device.backend, device.ddp_device_ids, device.is_cuda) == ("cpu", "gloo", None, False)
    assert cuda.current is None
    assert env == {"LOCAL_RANK": "1"}


def test_local_rank_beyond_the_gpus_is_one_clear_line() -> None:
    cuda = FakeCuda(True, 2)
    with pytest.raises(DeviceError) as caught:
        select(cuda, {"LOCAL_RANK": "2"})
    assert str(caught.value) == (
        "LOCAL_RANK 2 has no GPU: this VM has 2 CUDA device(s) "
        "(set `workers` of this resource candidate in the recipe to at most 2)"
    )
    assert "\n" not in str(caught.value) and cuda.current is None


def test_without_local_rank_the_worker_is_rank_zero() -> None:
    assert select(FakeCuda(True, 1), {}).name == "cuda:0"
    assert choose(0, False, 0) == WorkerDevice()


def test_select_asks_torch_when_no_cuda_module_is_given() -> None:
    import torch

    env = {"LOCAL_RANK": "0"}
    device = select(env=env)
    assert device.is_cuda == torch.cuda.is_available()
    assert (devices.NCCL_ENV.items() <= env.items()) == device.is_cuda
