"""Values stored in etcd: frozen dataclasses with a JSON form.

Every record encodes to one JSON object (`encode`) and decodes back (`decode`); unknown keys are
ignored on decode so an older spotrun can read what a newer one wrote. Timestamps are epoch seconds
(float). Provider-only details go in `NodeRecord.extra`, never in new fields.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar


class NodeState(str, enum.Enum):
    """Lifecycle of one VM, as the controller and agent record it."""

    BOOTING = "booting"
    BOOTSTRAPPING = "bootstrapping"
    RUNNING = "running"
    NOTICE = "notice"
    LEAVING = "leaving"
    PREEMPTED = "preempted"
    TERMINATED = "terminated"
    FAILED = "failed"

    @property
    def is_gone(self) -> bool:
        """True once the VM can never run again (preempted, terminated or failed)."""
        return self in (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.FAILED)


class NodeReason(str, enum.Enum):
    """Why a node is in its state, where that drives behaviour: compare these, never `NodeRecord.detail`.

    The values are the texts records carried before this enum existed, so the etcd JSON keeps them.
    """

    NONE = ""  # nothing to act on (the detail may say more)
    DRAIN = "drain requested"  # LEAVING: asked to leave (scale-down, TUI, a ready replacement); the agent leaves
    LEFT = "left the training job"  # LEAVING: out of the job; the controller terminates the VM
    FINISHED = "training finished"  # RUNNING: the job is over; the controller launches nothing more


@dataclass(frozen=True)
class NodeRecord:
    """One instance of a cluster (`/spotrun/<cluster>/nodes/<id>`)."""

    id: str
    cluster: str
    provider: str
    zone: str
    instance_type: str
    price_per_hour: float
    on_demand_per_hour: float
    ip: str | None = None
    ssh_port: int = 22
    state: NodeState = NodeState.BOOTING
    reason: NodeReason = NodeReason.NONE
    detail: str = ""  # why, for people (status, the TUI): behaviour never depends on it
    launched_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.state, NodeState):
            object.__setattr__(self, "state", NodeState(self.state))
        if not isinstance(self.reason, NodeReason):
            try:
                object.__setattr__(self, "reason", NodeReason(self.reason))
            except ValueError:  # free text, as records held before NodeReason: it is the detail
                object.__setattr__(self, "detail", self.detail or self.reason)
                object.__setattr__(self, "reason", NodeReason.NONE)

    @property
    def reason_text(self) -> str:
        """Why, for people: the detail, else the reason's own text."""
        return self.detail or self.reason.value


@dataclass(frozen=True)
class Notice:
    """A preemption notice for a node (`/spotrun/<cluster>/notices/<node>`)."""

    node: str
    source: str  # aws | gcp | azure | local
    deadline: float
    received_at: float


@dataclass(frozen=True)
class Progress:
    """The latest training report of a node (`/spotrun/<cluster>/progress/<node>`)."""

    node: str
    step: int
    samples_per_s: float
    world_size: int
    heartbeat_at: float
    loss: float | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    """A completed checkpoint (`/spotrun/<cluster>/checkpoints/<step>`)."""

    step: int
    path: str
    bytes: int
    sha256: str
    written_at: float
    seconds: float = 0.0  # how long writing it took (the agents size their leave margin from it)


@dataclass(frozen=True)
class LedgerSegment:
    """A stretch of time a node was billed at one price; `end` is None while it still runs."""

    node: str
    price_per_hour: float
    on_demand_per_hour: float
    start: float
    end: float | None = None


class EventKind(str, enum.Enum):
    """What one line of cluster history is about; `spotrun events`, `up --attach` and the TUI act
    on these, never on the message text. The values are the texts events carried before."""

    UP = "up"
    DOWN = "down"
    SCALE = "scale"
    LAUNCH = "launch"
    CAPACITY = "capacity"
    BOOTSTRAP = "bootstrap"
    JOIN = "join"
    READY = "ready"
    ACTIVATE = "activate"
    NOTICE = "notice"
    LEAVING = "leaving"
    LEAVE = "leave"
    DRAIN = "drain"
    TERMINATE = "terminate"
    PREEMPTED = "preempted"
    TERMINATED = "terminated"
    FAILED = "failed"
    FAILURE = "failure"
    FINISHED = "finished"
    BUDGET = "budget"
    PRICE = "price"
    CHAOS = "chaos"
    CONTROLLER = "controller"
    OTHER = "other"  # a kind this spotrun does not know (written by a newer one)

    def __str__(self) -> str:  # the plain text in messages and tables ("launch", not "EventKind.LAUNCH")
        return self.value


@dataclass(frozen=True)
class Event:
    """One line of cluster history (`/spotrun/<cluster>/events/<seq>`)."""

    seq: int
    at: float
    kind: EventKind
    message: str
    node: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EventKind):
            try:
                object.__setattr__(self, "kind", EventKind(self.kind))
            except ValueError:
                object.__setattr__(self, "kind", EventKind.OTHER)


@dataclass(frozen=True)
class LaunchIntent:
    """A launch recorded before the provider is called (`/spotrun/<cluster>/launches/<key>`);
    `key` is the idempotency key the provider labels its VMs with."""

    key: str
    count: int
    replaces: tuple[str, ...] = ()
    at: float = field(default_factory=time.time)
    standby: int = 0  # the last `standby` VMs of the launch become warm spares


Record = TypeVar("Record")


def to_dict(record: Any) -> dict[str, Any]:
    """A record as plain JSON-able data (enums become their values)."""
    data = dataclasses.asdict(record)
    return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in data.items()}


def from_dict(cls: type[Record], data: dict[str, Any]) -> Record:
    """Build `cls` from a dict, ignoring keys it does not know. Raises TypeError/ValueError if invalid."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def encode(record: Any) -> bytes:
    """A record as compact UTF-8 JSON bytes."""
    return json.dumps(to_dict(record), separators=(",", ":"), sort_keys=True).encode()


def decode(cls: type[Record], raw: bytes | str) -> Record:
    """Parse bytes written by `encode`. Raises ValueError (JSON) or TypeError (fields) if invalid."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    return from_dict(cls, data)
