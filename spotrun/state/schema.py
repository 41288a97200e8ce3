"""spotrun's etcd key layout: the one module that knows where each record lives.

Every key of a cluster starts with `/spotrun/<cluster>/`, followed by its kind:

    spec                      the recipe as JSON; its mod revision is the spec version
    target                    desired node count (`scale` writes it)
    nodes/<id>                NodeRecord: provider, zone, type, price, ip, state
    alive/<id>                agent liveness, bound to a lease
    notices/<id>              Notice: source, deadline
    standby/<id>              present while <id> is a warm spare
    progress/<id>             Progress: step, samples/s, world size, heartbeat
    checkpoints/<step:012d>   CheckpointRecord
    ledger/<id>               the node's LedgerSegments (a JSON list)
    events/<seq:012d>         Event: one line of history
    launches/<key>            LaunchIntent: a launch the provider may not have finished
    stopped                   the budget stopped the cluster: {"reason", "at"}
    chaos/start               when the chaos schedule's clock started: {"at"}
    chaos/fired-<i>, chaos/trace-<i>   a schedule entry / trace event that fired: {"at"}
    rdzv/<run_id>/...         the elastic rendezvous: state, store/<key>, alive/<node>,
                              waiting/<node>, lost/<node> (spotrun's run id is the cluster name)

Numbers in keys are zero-padded so lexical order is numeric order; ids are checked (`check_name`)
so no key can escape its prefix. Values are JSON (`spotrun.state.records`). Pure string functions:
no I/O here (`spotrun.state.store` reads and writes the records).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

ROOT = "/spotrun/"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Kind(str, enum.Enum):
    """The first path segment after `/spotrun/<cluster>/`."""

    SPEC = "spec"
    TARGET = "target"
    NODES = "nodes"
    ALIVE = "alive"
    NOTICES = "notices"
    STANDBY = "standby"
    PROGRESS = "progress"
    CHECKPOINTS = "checkpoints"
    LEDGER = "ledger"
    EVENTS = "events"
    LAUNCHES = "launches"
    STOPPED = "stopped"
    CHAOS = "chaos"
    RDZV = "rdzv"

    @property
    def is_history(self) -> bool:
        """Kept after `spotrun down` (without --purge): what the cluster was, ran and cost."""
        return self in (Kind.SPEC, Kind.CHECKPOINTS, Kind.LEDGER, Kind.EVENTS)


_KINDS = {kind.value: kind for kind in Kind}  # parse_key runs for every watch event (the TUI: thousands a second)


class RdzvPart(str, enum.Enum):
    """The parts of one rendezvous run under `rdzv/<run_id>/`."""

    STATE = "state"  # the one state blob, compare-and-set on its revision
    STORE = "store"  # the c10d store the agents share
    ALIVE = "alive"  # members, each bound to its node's lease
    WAITING = "waiting"  # nodes waiting to join the next round
    LOST = "lost"  # a survivor's report that a peer vanished


class ChaosMark(str, enum.Enum):
    """Which list a fired chaos entry belongs to; its key is `chaos/<mark>-<index>`."""

    SCHEDULE = "fired"  # the recipe's chaos.preempt entries
    TRACE = "trace"  # events of a replayed preemption trace


@dataclass(frozen=True)
class ParsedKey:
    """A cluster key taken apart: its kind and the rest (`""` for single keys such as spec)."""

    kind: Kind
    item: str = ""


@dataclass(frozen=True)
class RdzvKey:
    """A rendezvous key taken apart: `rdzv/<run_id>/<part>/<node>` (node `""` for the state blob)."""

    run_id: str
    part: str  # a RdzvPart value, or whatever a newer writer used
    node: str = ""


def check_name(what: str, name: str) -> str:
    """`name` if it is safe as one key segment, else ValueError naming `what`."""
    if not _NAME.match(name):
        raise ValueError(
            f"{what} {name!r} must be 1-128 of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def cluster_prefix(cluster: str) -> str:
    """`/spotrun/<cluster>/`: every key of one cluster starts with it."""
    return f"{ROOT}{check_name('cluster', cluster)}/"


def key(cluster: str, kind: Kind, item: str | int | None = None) -> str:
    """The etcd key of `kind` in `cluster`, with `item` (an id, or an int zero-padded) below it."""
    base = cluster_prefix(cluster) + kind.value
    if item is None:
        return base
    return f"{base}/{item:012d}" if isinstance(item, int) else f"{base}/{check_name(f'{kind.value} id', item)}"


def kind_prefix(cluster: str, kind: Kind) -> str:
    """`/spotrun/<cluster>/<kind>/`: every item of one kind."""
    return key(cluster, kind) + "/"


def chaos_key(cluster: str, mark: ChaosMark, index: int) -> str:
    """`chaos/<mark>-<index>`: written once when that chaos entry fired."""
    return key(cluster, Kind.CHAOS, f"{mark.value}-{index}")


def chaos_start_key(cluster: str) -> str:
    """`chaos/start`: when the cluster's chaos clock started."""
    return key(cluster, Kind.CHAOS, "start")


def rdzv_prefix(cluster: str, run_id: str) -> str:
    """`/spotrun/<cluster>/rdzv/<run_id>/`: everything of one rendezvous run."""
    return key(cluster, Kind.RDZV, run_id) + "/"


def rdzv_state_key(cluster: str, run_id: str) -> str:
    """The rendezvous run's state blob."""
    return rdzv_prefix(cluster, run_id) + RdzvPart.STATE.value


def rdzv_key(cluster: str, run_id: str, part: RdzvPart, node: str = "") -> str:
    """`.../rdzv/<run_id>/<part>/<node>`; with no node, the prefix of that part."""
    return f"{rdzv_prefix(cluster, run_id)}{part.value}/{node}"


def parse_key(cluster: str, k: str) -> ParsedKey | None:
    """The kind and item of a key of `cluster`; None for a key elsewhere or of a kind this spotrun
    does not know."""
    prefix = cluster_prefix(cluster)
    if not k.startswith(prefix):
        return None
    name, _, item = k[len(prefix) :].partition("/")
    kind = _KINDS.get(name)
    return None if kind is None else ParsedKey(kind, item)


def parse_rdzv_key(cluster: str, k: str) -> RdzvKey | None:
    """The run, part and node of a rendezvous key of `cluster`; None for any other key."""
    parsed = parse_key(cluster, k)
    if parsed is None or parsed.kind is not Kind.RDZV:
        return None
    run_id, _, rest = parsed.item.partition("/")
    part, _, node = rest.partition("/")
    return RdzvKey(run_id, part, node) if run_id and part else None


def cluster_of(k: str) -> str | None:
    """The cluster a key belongs to, None for a key outside `/spotrun/`."""
    return k[len(ROOT) :].split("/", 1)[0] if k.startswith(ROOT) else None
