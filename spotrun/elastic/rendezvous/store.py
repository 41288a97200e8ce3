"""The c10d `Store` the agents share, in etcd, so it survives any node.

torch's agents use it for rank assignment, MASTER_ADDR/PORT and the exit barrier. torch's own
c10d store (a TCPStore) lives on the node that hosts it and dies with it; this one lives under
`/spotrun/<cluster>/rdzv/<run_id>/store/` and wakes waiters on the backend's watch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from spotrun.elastic.rendezvous.backend import EtcdRendezvousBackend
from spotrun.elastic.rendezvous.fork_guard import check_not_forked
from spotrun.errors import ControlPlaneError

_R = TypeVar("_R")


class RoundBrokenError(dist.DistStoreError):
    """A blocking wait ended early: the rendezvous round whose keys it waits for lost a member, whose
    keys would never come (torch's agent would wait out the store timeout, 300 s)."""


class EtcdStore(dist.Store):
    """A c10d `Store` for the agents, in etcd under the run's `store/` prefix.

    Blocking `get`/`wait` wake on the backend's watch (polling every 0.5 s as a fallback) and
    raise `DistStoreError` after the store timeout, or `RoundBrokenError` as soon as `broken`
    (set by the handler) names a reason: a member of the round the keys belong to is gone. Keys
    are stored as given (torch prefixes them with `torch.rendezvous.<run>.<round>/`), so old rounds
    can be deleted by prefix.
    """

    def __init__(self, backend: EtcdRendezvousBackend, timeout: timedelta | None = None) -> None:
        super().__init__()
        self._backend = backend
        self._etcd = backend.store
        self._prefix = backend.store_prefix
        self.broken: Callable[[], str | None] | None = None
        if timeout is not None:
            self.set_timeout(timeout)

    def _k(self, key: str | bytes) -> str:
        return self._prefix + (key.decode() if isinstance(key, bytes) else key)

    @staticmethod
    def _b(value: str | bytes | list[int]) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        return bytes(value)

    def _call(self, fn: Callable[..., _R], *args: Any) -> _R:
        check_not_forked()
        try:
            return fn(*args)
        except ControlPlaneError as exc:
            raise dist.DistStoreError(f"etcd store: {exc}") from exc

    def set(self, key: str, value: str | bytes) -> None:
        self._call(self._etcd.put, self._k(key), self._b(value))

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        for k, v in zip(keys, values, strict=False):
            self.set(k, v)

    def _try_get(self, keys: list[str]) -> list[bytes] | None:
        out = []
        for k in keys:
            found = self._call(self._etcd.get, self._k(k))
            if found is None:
                return None
            out.append(found[0])
        return out

    def _wait_get(self, keys: list[str], timeout: timedelta | None = None) -> list[bytes]:
        limit = (timeout or self.timeout).total_seconds()  # type: ignore[attr-defined]  # a property torch's stub omits
        deadline = time.monotonic() + limit
        while True:
            generation = self._backend.store_generation
            got = self._try_get(keys)
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise dist.DistStoreError(f"timed out after {limit:.0f} s waiting for keys {keys} in the etcd store")
            why = self.broken() if self.broken is not None else None
            if why:
                raise RoundBrokenError(f"gave up waiting for keys {keys} in the etcd store: {why}")
            self._backend.wait_store_change(generation, min(left, 0.5))  # woken by alive-key changes too

    def get(self, key: str) -> bytes:
        return self._wait_get([key])[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_get(list(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_get(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        return self._try_get(list(keys)) is not None

    def add(self, key: str, amount: int) -> int:
        k = self._k(key)
        for _ in range(1000):
            found = self._call(self._etcd.get, k)
            value = (int(found[0]) if found else 0) + amount
            if self._call(self._etcd.cas, k, found[1] if found else None, str(value).encode()):
                return value
        raise dist.DistStoreError(f"etcd store: add on {key!r} kept conflicting")

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        k, expected_b, desired_b = self._k(key), self._b(expected), self._b(desired)
        while True:
            found = self._call(self._etcd.get, k)
            if found is None:
                if expected_b:
                    return expected_b
                if self._call(self._etcd.cas, k, None, desired_b):
                    return desired_b
            elif found[0] != expected_b:
                return found[0]
            elif self._call(self._etcd.cas, k, found[1], desired_b):
                return desired_b

    def delete_key(self, key: str) -> bool:
        return bool(self._call(self._etcd.delete, self._k(key)))

    def num_keys(self) -> int:
        return len(self._call(self._etcd.get_prefix, self._prefix))

    def delete_round(self, round_prefix: str) -> int:
        """Delete every key of one rendezvous round (`torch.rendezvous.<run>.<round>/`)."""
        return int(self._call(self._etcd.delete_prefix, self._prefix + round_prefix))
