"""The provider protocol: what spotrun needs from a cloud, and the values that cross it.

This is spotrun's own small contract, not libcloud's NodeDriver: five verbs, frozen values,
a normalized `InstanceState`, and an `extra` dict for anything provider-specific (never a
subclass). Optional operations are announced by `supports_<feature>` flags and checked with
`supports()`, so callers never branch on the provider's type or name. What callers must know
before any provider is built is a `Feature` of the provider's package (its catalog's
`FEATURES`), and how a VM hears of its preemption is the package's `NoticeSpec`.

Standard library only: the node agent on every VM imports this module.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from spotrun.errors import ProviderError

# The name of a provider whose package speaks a notice protocol of its own (a cloud); the
# registry lists them: `spotrun.providers.notice_protocols()`.
NoticeProtocol = str

_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_PUBLIC_KEY = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( .*)?$")


class InstanceState(str, enum.Enum):
    """Normalized VM state; `preempted` instances carry the provider's reason in `Instance.reason`."""

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    TERMINATED = "terminated"
    FAILED = "failed"

    @property
    def is_gone(self) -> bool:
        """True once the VM can never run again (preempted, terminated or failed)."""
        return self in (InstanceState.PREEMPTED, InstanceState.TERMINATED, InstanceState.FAILED)


@dataclass(frozen=True)
class Offer:
    """One purchasable shape in one zone; prices are USD per instance-hour."""

    provider: str
    region: str
    zone: str
    instance_type: str
    cpus: int
    gpus: int
    gpu_name: str | None
    spot_price: float
    on_demand_price: float
    spot: bool = True

    @property
    def price(self) -> float:
        """The price actually paid per hour: the spot price for a spot offer, else on-demand."""
        return self.spot_price if self.spot else self.on_demand_price


@dataclass(frozen=True)
class LaunchSpec:
    """A request for `count` VMs of one offer for one cluster.

    `idempotency_key` names this request: launching the same key again returns the VMs the
    first call created instead of creating more (the controller may crash and retry).
    """

    cluster: str
    offer: Offer
    count: int
    ssh_public_key: str
    idempotency_key: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _CLUSTER_NAME.match(self.cluster):
            raise ProviderError(
                f"cluster name {self.cluster!r} is not valid",
                hint="use letters, digits, '.', '_' or '-', at most 63 characters",
            )
        if self.count < 1:
            raise ProviderError(f"launch count ({self.count}) must be >= 1")
        if not self.idempotency_key:
            raise ProviderError(f"launch for cluster {self.cluster!r} has an empty idempotency key")
        if not _PUBLIC_KEY.match(self.ssh_public_key.strip()):
            raise ProviderError(f"ssh_public_key {self.ssh_public_key[:30]!r}... is not an OpenSSH public key")


@dataclass(frozen=True)
class Instance:
    """One VM as the provider reports it right now; re-read it, never cache it.

    `host_public_key` is the VM's SSH host key as "type base64", for pinning (never trust on
    first use). `extra` holds provider-specific details (local: vm_dir, log, init_pid).
    """

    id: str
    cluster: str
    provider: str
    zone: str
    instance_type: str
    state: InstanceState
    reason: str | None
    host: str
    ssh_port: int
    ssh_user: str
    host_public_key: str
    metadata_url: str
    price_per_hour: float
    on_demand_per_hour: float
    launched_at: float
    labels: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """What every provider implements; see providers/local/provider.py for the reference behaviour.

    Optional operations, each present only when its flag is True:
      `preempt(instance_id, notice_seconds)` (supports_preempt): inject a spot preemption.
      `purge(cluster)` (supports_purge): remove what terminated VMs left behind (logs, dirs).
      `cleanup(cluster)` (supports_cleanup): remove the cluster's cloud resources other than VMs.
      `set_capacity(cluster, nodes)` (supports_capacity): cap the cluster's VMs (trace replays).
    """

    name: str
    notice_protocol: NoticeProtocol
    supports_preempt: bool
    supports_purge: bool

    def offers(self) -> list[Offer]:
        """Every offer with current prices. Blocking (may call the cloud); raises ProviderError."""
        ...

    def launch(self, spec: LaunchSpec) -> list[str]:
        """Create `spec.count` VMs labelled with the cluster and idempotency key; return their ids.

        Idempotent per `spec.idempotency_key`: VMs that already carry the key are returned and
        only the difference is launched. Blocks until the new VMs accept SSH or fail.
        Raises CapacityError when the offer has no capacity, ProviderError otherwise.
        """
        ...

    def instances(self, cluster: str) -> list[Instance]:
        """Every VM of `cluster` (any state), read fresh from the provider on each call."""
        ...

    def terminate(self, ids: Sequence[str]) -> None:
        """Stop and delete the VMs; blocks until they are gone. Idempotent: unknown or already
        terminated ids are ignored. Raises ProviderError if a VM cannot be stopped."""
        ...


class SupportsPreempt(Protocol):
    """A provider whose `supports_preempt` is True."""

    def preempt(self, instance_id: str, notice_seconds: float) -> float:
        """Arm a spot preemption notice on the VM; it dies at the returned deadline (epoch s)."""
        ...


class SupportsCapacity(Protocol):
    """A provider whose `supports_capacity` is True."""

    def set_capacity(self, cluster: str, nodes: int | None) -> None:
        """Let the cluster have at most `nodes` VMs (None: no limit); launches beyond it fail."""
        ...


class SupportsCleanup(Protocol):
    """A provider whose `supports_cleanup` is True."""

    def cleanup(self, cluster: str) -> None:
        """Delete what the cluster made besides VMs (key pairs, security groups). Idempotent."""
        ...


class SupportsPurge(Protocol):
    """A provider whose `supports_purge` is True."""

    def purge(self, cluster: str) -> None:
        """Remove what terminated VMs left behind (logs, dirs). Idempotent."""
        ...


def supports(provider: object, feature: str) -> bool:
    """Whether `provider` offers an optional operation, e.g. `supports(p, "preempt")`."""
    return bool(getattr(provider, f"supports_{feature}", False))


class Feature(str, enum.Enum):
    """What a provider offers that callers must know before building one (recipe validation,
    `spotrun up`, the controller); each package lists its own in `catalog.FEATURES`."""

    HEAD_VM = "head_vm"  # it can host etcd and the controller on an on-demand head VM
    EMBEDDED_ETCD = "embedded_etcd"  # its VMs reach this machine's loopback, so the embedded etcd
    CHAOS = "chaos"  # the controller can play a recipe's chaos schedule on it (its class supports preempt)
    # It takes its price table from the recipe (`prices`, `boot_s`: `prices=` of its class);
    # its catalog's DEFAULT_PRICES are the entries the recipe does not give.
    RECIPE_PRICES = "recipe_prices"


@dataclass(frozen=True)
class HttpReply:
    """One answer of a metadata endpoint; error statuses are replies too."""

    status: int
    body: str
    headers: Mapping[str, str]


# `fetch(method, path, headers, wait_s=0)`: one request to the VM's metadata endpoint, allowed
# `wait_s` longer than the watcher's timeout (a long poll). Network errors raise OSError.
Fetch = Callable[..., HttpReply]


class NoticeReader(Protocol):
    """One VM's side of a cloud's notice protocol. Keeps what the protocol needs between polls
    (a token, an ETag, the VM's name); one reader per watcher, not thread-safe."""

    @property
    def can_wait(self) -> bool:
        """Whether the next `poll(wait_s=...)` blocks until the value changes (a long poll)."""
        ...

    def poll(self, fetch: Fetch, *, wait_s: int = 0) -> tuple[float, str] | None:
        """(deadline epoch s, raw notice) if a notice is out, else None. With `wait_s` and
        `can_wait`, blocks up to `wait_s` seconds for a change. Raises OSError, ValueError, KeyError or
        TypeError on any network or protocol error (the watcher logs it and tries again)."""
        ...


@dataclass(frozen=True)
class NoticeSpec:
    """A cloud's notice protocol as its package's `notices.PROTOCOL` declares it.

    `reader(lead_s)` makes a fresh `NoticeReader`; `lead_s` is the notice's lead time to assume
    where the protocol gives no deadline (GCP)."""

    base_url: str  # the metadata endpoint on a real VM of this cloud
    poll_interval_s: float  # pause between plain polls
    reader: Callable[[float], NoticeReader]


def lazy_attribute(package: str, name: str, module: str) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package` that imports `name` from `module` on first
    use, so a provider package re-exports its provider class without importing it up front."""

    def __getattr__(attribute: str) -> Any:
        if attribute != name:
            raise AttributeError(f"module {package!r} has no attribute {attribute!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


def environ_matching(wanted: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` named in `wanted`, or starting with one of its entries that
    end in '_' (prefixes such as "SPOTRUN_AWS_")."""
    prefixes = tuple(w for w in wanted if w.endswith("_"))
    return {k: v for k, v in environ.items() if k in wanted or (prefixes and k.startswith(prefixes))}
