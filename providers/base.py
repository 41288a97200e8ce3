"""The provider protocol: what spotrun needs from a cloud, and the values that cross it.

This is spotrun's own small contract, not libcloud's NodeDriver: five verbs, frozen values,
a normalized `InstanceState`, and an `extra` dict for anything provider-specific (never a
subclass). Optional operations are announced by `supports_<feature>` flags and checked with
`supports()`, so callers never branch on the provider's type or name.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from spotrun.errors import ProviderError

NoticeProtocol = Literal["aws", "gcp", "azure"]
NOTICE_PROTOCOLS: tuple[str, ...] = ("aws", "gcp", "azure")

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

    @property
    def ssh_target(self) -> tuple[str, int, str]:
        """(host, port, user) for an SSH client."""
        return self.host, self.ssh_port, self.ssh_user


@runtime_checkable
class Provider(Protocol):
    """What every provider implements; see providers/local.py for the reference behaviour.

    Optional operations, each present only when its flag is True:
      `preempt(instance_id, notice_seconds)` (supports_preempt): inject a spot preemption.
      `purge(cluster)` (supports_purge): remove what terminated VMs left behind (logs, dirs).
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


def supports(provider: object, feature: str) -> bool:
    """Whether `provider` offers an optional operation, e.g. `supports(p, "preempt")`."""
    return bool(getattr(provider, f"supports_{feature}", False))
