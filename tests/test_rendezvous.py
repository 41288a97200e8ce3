"""spotrun's etcd v3 rendezvous backend, store and handler against a real etcd (no torchrun)."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousStateError,
)

from spotrun.elastic import rendezvous as rdzv
from spotrun.elastic.rendezvous import torch_patches
from spotrun.state import store as store_mod


@pytest.fixture
def backend(store: store_mod.Store, cluster: str) -> Iterator[rdzv.EtcdRendezvousBackend]:
    b = rdzv.EtcdRendezvousBackend(store, cluster, "run1")
    yield b
    b.close()


def _params(
    endpoint: str, cluster: str, node: str, min_nodes: int = 1, max_nodes: int = 3, **conf: str
) -> RendezvousParameters:
    conf = {
        "cluster": cluster,
        "node": node,
        "last_call_timeout": "10",
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "5",
        "join_timeout": "30",
        **conf,
    }
    return RendezvousParameters("spotrun-etcd", endpoint, "run1", min_nodes, max_nodes, "127.0.0.1", **conf)


@pytest.fixture
def handlers(etcd_server, cluster: str) -> Iterator[list[rdzv.SpotrunRendezvousHandler]]:
    made: list[rdzv.SpotrunRendezvousHandler] = []
    yield made
    for h in made:
        h.finish(closed=False)


def _make(made: list, etcd_server, cluster: str, node: str, **kw) -> rdzv.SpotrunRendezvousHandler:
    h = rdzv.create_handler(_params(etcd_server.endpoint, cluster, node, **kw))
    made.append(h)
    return h


def _join_all(hs: list[rdzv.SpotrunRendezvousHandler], timeout: float = 20) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    errors: list[BaseException] = []

    def go(h: rdzv.SpotrunRendezvousHandler) -> None:
        try:
            info = h.next_rendezvous()
            out[h.node_id] = (info.rank, info.world_size)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(h,)) for h in hs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return out


# --- backend: the state blob with compare-and-set -----------------------------------------


def test_state_is_none_until_set_and_create_only_once(backend: rdzv.EtcdRendezvousBackend) -> None:
    assert backend.name == "spotrun-etcd"
    assert backend.get_state() is None
    state, token, ok = backend.set_state(b"first", None)
    assert (state, ok) == (b"first", True)
    again = backend.set_state(b"second", None)  # must not exist: loses, returns the stored state
    assert again == (b"first", token, False)
    assert backend.get_state() == (b"first", token)


def test_stale_token_loses_and_returns_the_winner(store: store_mod.Store, cluster: str, backend) -> None:
    other = rdzv.EtcdRendezvousBackend(store, cluster, "run1", watch=False)
    _, token, _ = backend.set_state(b"v1")
    _, token_b, ok_b = other.set_state(b"v2-from-b", token)
    assert ok_b and token_b != token
    state, token_a, ok_a = backend.set_state(b"v2-from-a", token)  # stale
    assert (state, token_a, ok_a) == (b"v2-from-b", token_b, False)
    assert backend.set_state(b"v3", "not-a-token") == (b"v2-from-b", token_b, False)
    assert backend.set_state(b"v3", token_b)[2]


def test_foreign_blob_is_a_state_error(store: store_mod.Store, backend) -> None:
    store.put(backend.state_key, b"garbage")
    with pytest.raises(RendezvousStateError):
        backend.get_state()


def test_unreachable_etcd_is_a_connection_error(etcd_process, cluster: str) -> None:
    st = store_mod.connect([etcd_process.endpoint], timeout=1.0)
    b = rdzv.EtcdRendezvousBackend(st, cluster, "run1", watch=False)
    try:
        etcd_process.stop()
        with pytest.raises(RendezvousConnectionError) as err:
            b.get_state()
        assert isinstance(err.value.__cause__, Exception)
        with pytest.raises(RendezvousConnectionError):
            b.set_state(b"x", None)
    finally:
        st.close()


def test_watch_counts_changes(store: store_mod.Store, backend) -> None:
    deadline = time.time() + 5
    while not backend.watching:
        assert time.time() < deadline
        time.sleep(0.01)
    gen = backend.generation
    threading.Timer(0.1, lambda: backend.set_state(b"x")).start()
    t0 = time.monotonic()
    assert backend.wait_change(gen, 5)
    assert time.monotonic() - t0 < 2


# --- the agents' c10d store ---------------------------------------------------------------


def test_etcd_store_ops(backend) -> None:
    s = rdzv.EtcdStore(backend, timeout=timedelta(seconds=2))
    p = dist.PrefixStore("torch.rendezvous.run1.0", s)
    p.set("a", "1")
    assert p.get("a") == b"1"
    assert p.add("n", 2) == 2 and p.add("n", 3) == 5
    p.multi_set(["x", "y"], ["1", "2"])
    assert p.multi_get(["x", "y"]) == [b"1", b"2"]
    assert p.check(["a", "x"]) and not p.check(["missing"])
    assert s.compare_set("cs", "", "v1") == b"v1"
    assert s.compare_set("cs", "wrong", "v2") == b"v1"
    assert s.compare_set("cs", "v1", "v2") == b"v2"
    threading.Timer(0.2, lambda: p.set("late", "ok")).start()
    t0 = time.monotonic()
    assert p.get("late") == b"ok"  # blocks until another writer sets it, woken by the watch
    assert time.monotonic() - t0 < 1.5
    s.set_timeout(timedelta(milliseconds=300))
    with pytest.raises(dist.DistStoreError):
        p.get("never")
    assert s.delete_round("torch.rendezvous.run1.0/") >= 5
    assert not p.check(["a"])


# --- handler ------------------------------------------------------------------------------


def test_registered_through_the_entry_point(etcd_server, cluster: str, handlers) -> None:
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    h = get_rendezvous_handler(_params(etcd_server.endpoint, cluster, "n1"))
    handlers.append(h)
    assert isinstance(h, rdzv.SpotrunRendezvousHandler) and h.get_backend() == "spotrun-etcd"


def test_last_call_ends_when_every_live_node_joined(etcd_server, cluster: str, handlers) -> None:
    a, b = _make(handlers, etcd_server, cluster, "a"), _make(handlers, etcd_server, cluster, "b")
    t0 = time.monotonic()
    ranks = _join_all([a, b])
    took = time.monotonic() - t0
    print(f"\n[rendezvous] 2 live nodes, last_call_timeout=10: complete in {took:.2f} s")
    assert sorted(ranks.values()) == [(0, 2), (1, 2)]
    assert took < 5  # not the 10 s last call


def test_dead_lease_drops_a_node_at_once(etcd_server, store, cluster: str, handlers) -> None:
    a, b = _make(handlers, etcd_server, cluster, "a"), _make(handlers, etcd_server, cluster, "b")
    _join_all([a, b])
    assert a.num_nodes_waiting() == 0
    b._stop_heartbeats()
    b._alive.stop(revoke=False)  # b vanishes silently: its lease expires, torch's heartbeat would need 5 s
    t0 = time.monotonic()
    while a.num_nodes_waiting() == 0:  # what torch's agent polls: restart the local workers
        assert time.monotonic() - t0 < 6
        time.sleep(0.05)
    seen = time.monotonic() - t0
    assert _join_all([a]) == {"a": (0, 1)}
    took = time.monotonic() - t0
    print(f"\n[rendezvous] silently vanished peer: seen by the agent after {seen:.2f} s, new round after {took:.2f} s")
    assert took < 4.5


def test_wait_for_a_dead_members_keys_ends_and_the_round_forms_again(
    etcd_server, store, cluster: str, handlers
) -> None:
    from spotrun.elastic.rendezvous.store import RoundBrokenError

    made = {n: _make(handlers, etcd_server, cluster, n) for n in "abc"}
    ranks = _join_all(list(made.values()))
    # The highest rank is hard-killed right after the round completed: it never writes its
    # rank-assignment key, and the survivors' ranks stay 0..n-1 without it.
    dead = max(ranks, key=lambda n: ranks[n][0])
    a, b = (made[n] for n in sorted(made) if n != dead)
    made[dead]._stop_heartbeats()
    made[dead]._alive.stop(revoke=False)
    store_a = dist.PrefixStore("torch.rendezvous.run1.x", a._etcd_store)
    store_a.set_timeout(timedelta(seconds=60))  # torch's default is 300 s
    t0 = time.monotonic()
    with pytest.raises(RoundBrokenError):
        store_a.get(f"torchelastic/role_info/{ranks[dead][0]}")
    took = time.monotonic() - t0
    print(f"\n[rendezvous] wait for a dead member's key given up after {took:.2f} s")
    assert took < 6
    assert sorted(_join_all([a, b]).values()) == [(0, 2), (1, 2)], "the survivors form a round without it"
    # Once the agent monitors its workers, a wait is no longer about this round's start.
    assert a.num_nodes_waiting() == 0
    store_a.set_timeout(timedelta(milliseconds=300))
    with pytest.raises(dist.DistStoreError) as raised:
        store_a.get("never")
    assert not isinstance(raised.value, RoundBrokenError)


def test_leave_removes_the_node_and_its_alive_key(etcd_server, store, cluster: str, handlers) -> None:
    a, b = _make(handlers, etcd_server, cluster, "a"), _make(handlers, etcd_server, cluster, "b")
    _join_all([a, b])
    assert a.num_nodes_waiting() == 0
    b.leave()
    assert b.left
    deadline = time.monotonic() + 2
    while a.num_nodes_waiting() == 0:  # a's agent sees its round broken and restarts its workers
        assert time.monotonic() < deadline
        time.sleep(0.01)
    state = pickle.loads(a._backend.get_state()[0])
    assert b._this_node not in state.participants and b._this_node not in state.last_heartbeats
    assert store.get(a._backend.alive_prefix + "b") is None
    t0 = time.monotonic()
    assert _join_all([a]) == {"a": (0, 1)}
    assert time.monotonic() - t0 < 2
    with pytest.raises(RendezvousGracefulExitError):
        b.next_rendezvous()


def test_request_leave_leaves_at_the_next_rendezvous(etcd_server, cluster: str, handlers) -> None:
    a = _make(handlers, etcd_server, cluster, "a")
    _join_all([a])
    a.request_leave()
    assert not a.left
    with pytest.raises(RendezvousGracefulExitError):
        a.next_rendezvous()
    assert a.left
    state = pickle.loads(a._backend.get_state()[0])
    assert not state.participants and not state.closed  # left, did not close the job


def test_joiner_publishes_waiting_key_and_is_not_counted(etcd_server, store, cluster: str, handlers) -> None:
    a, b = _make(handlers, etcd_server, cluster, "a"), _make(handlers, etcd_server, cluster, "b")
    _join_all([a, b])
    c = _make(handlers, etcd_server, cluster, "c")
    waiting_key = c._backend.waiting_prefix + "c"
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(_join_all([c], timeout=30)))
    t.start()
    deadline = time.time() + 10
    while store.get(waiting_key) is None:
        assert time.time() < deadline, "no waiting key"
        time.sleep(0.02)
    assert a.num_nodes_waiting() == 0  # coordinated: the trainer admits joiners
    t0 = time.monotonic()
    ranks = _join_all([a, b])  # what a trainer-side restart (exit 75) makes every agent do
    t.join(30)
    print(f"\n[rendezvous] joiner admitted after the others re-rendezvoused: {time.monotonic() - t0:.2f} s")
    assert sorted([*ranks.values(), *result.values()]) == [(0, 3), (1, 3), (2, 3)]
    assert store.get(waiting_key) is None


def test_delay_patch_leaves_other_threads_alone() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    assert torch_patches._install_delay_patch()
    assert dr._delay is torch_patches._watching_delay
    t0 = time.monotonic()
    dr._delay(0.2)  # not on a spotrun executor thread: torch's plain sleep
    assert 0.18 <= time.monotonic() - t0 < 1


def test_forked_child_cannot_use_the_connection(backend) -> None:
    pid = os.fork()
    if pid == 0:  # child: must raise at once instead of touching gRPC
        try:
            backend.get_state()
        except RuntimeError:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.get_state() is None  # the parent's channel still works
