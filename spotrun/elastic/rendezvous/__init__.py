"""etcd v3 rendezvous for torchrun: backend `spotrun-etcd`, registered through `torchrun.handlers`.

torch's `DynamicRendezvousHandler` keeps all membership logic; this package gives it

- `EtcdRendezvousBackend`: the state blob under `/spotrun/<cluster>/rdzv/<run_id>/state`, written
  by compare-and-set on the key's mod revision (the fencing token);
- `EtcdStore`: the c10d `Store` the agents share (rank assignment, MASTER_ADDR/PORT, the exit
  barrier) under `.../rdzv/<run_id>/store/`, so it survives any node (torch's c10d store dies
  with the node that hosts it);
- `SpotrunRendezvousHandler`: the handler, with four speed-ups over torch's defaults:

  1. Liveness by lease. Each handler holds `.../rdzv/<run_id>/alive/<node>` bound to a short
     etcd lease (1 s on spotrun's own etcd, refreshed every ttl/3; see etcd_server.ELECTION_ARGS).
     A node in the state whose alive key is gone counts as dead at the next read: its heartbeat
     is aged so torch's own sanitizer drops it (`torch_patches.SpotrunStateHolder._sanitize`).
     torch's heartbeats still run as a second check.
  2. Watches instead of fixed polls. One etcd watch on the run prefix wakes the handler on any
     change of the state or of an alive key: the op executor's `_delay(seconds=1)` and the 1 s
     state cache end at the first change (the 1 s stay the upper bound), and a participant
     waiting for the last-call deadline wakes at the deadline instead of up to 1 s after it.
  3. Early last call. Once every live node of the run (every alive key) is a participant, the
     round completes at once instead of after `last_call_timeout`.
  4. Leaving. `leave()` revokes the alive lease (every survivor sees the delete through its watch)
     and removes the node from participants, wait list and redundancy list by compare-and-set.
     `request_leave()` makes the next `next_rendezvous()` leave and raise
     `RendezvousGracefulExitError`. `shutdown()` leaves and never closes the rendezvous; the
     launcher closes it (`finish(closed=True)`) only when the job has finished.

Joins are coordinated by the trainer: a node waiting for
the next round publishes `.../rdzv/<run_id>/waiting/<node>` (bound to its alive lease) and
`num_nodes_waiting()` reports 0, so torch never kills workers mid-step for a join; spotrun's agent
sees the key, the trainer checkpoints at a step boundary and its workers exit 75, every agent
re-rendezvouses and the joiner is admitted.
`num_nodes_waiting()` also reports 1 as soon as the round the local workers run in loses a member
(a lease expired or a node left), so every agent restarts its workers at once rather than waiting
for a collective to time out.

Conf keys (`--rdzv-conf`): `cluster` (default: the run id), `node` (spotrun node id for the alive
and waiting keys; default `<host>-<pid>`), `lease_ttl` (s, default 1; an etcd run with etcd's
default election timeout rounds it up to its minimum, 2 s),
`expected_nodes` and `gather_timeout` (s, default 15: how long a round's last call waits for
alive nodes, or in the first round for `expected_nodes`), plus torch's `join_timeout`,
`last_call_timeout`, `close_timeout`, `heartbeat_timeout`, `keep_alive_interval`,
`keep_alive_max_attempt`.

Peer lost: a worker that exits because a peer died touches `$SPOTRUN_PEER_LOST_FILE`; the
handler then puts `.../rdzv/<run_id>/lost/<node>` (bound to its alive lease) as it re-joins, and
the controller, woken by it, looks at the provider before the dead node's lease has ended.

Creating a handler sets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in this process: torch's shared
agent TCPStore lives on the rank-0 node and dies with it; the agents share `EtcdStore` instead.

Forked workers must never use the launcher's etcd connection (gRPC is not fork-safe): an
at-fork hook marks a forked child, after which every etcd call from this package raises
(`fork_guard`).

Modules, along torch's own seams (STYLE.md §2): `backend` (the state blob, compare-and-set on
the etcd revision), `store` (the c10d store), `handler` (the handler), `torch_patches` (every
touch of torch's private internals, with the reason), `creator` (what torchrun's entry point
calls), `fork_guard`.
"""

# torch's rendezvous package loads the `torchrun.handlers` entry points (ours names
# spotrun.elastic.rendezvous.creator) when it is first imported; importing it before any module of
# this package starts loading lets that registration import the creator whole, not half-initialized.
import torch.distributed.elastic.rendezvous  # noqa: F401  (for its side effect, see above)

from spotrun.elastic.rendezvous.backend import BACKEND_NAME, EtcdRendezvousBackend
from spotrun.elastic.rendezvous.creator import create_handler, handler_creator
from spotrun.elastic.rendezvous.handler import SpotrunRendezvousHandler, current_handler
from spotrun.elastic.rendezvous.store import EtcdStore

__all__ = [
    "BACKEND_NAME",
    "EtcdRendezvousBackend",
    "EtcdStore",
    "SpotrunRendezvousHandler",
    "create_handler",
    "current_handler",
    "handler_creator",
]
