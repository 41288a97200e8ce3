"""The controller's decisions as a pure function: `plan(desired, observed) -> [Action]`.

No I/O here, so every rule is unit-tested and the simulator can reuse it tick by tick. Rules:
- a node counts toward the target while it runs and is neither noticed nor leaving, so a notice
  makes room for a replacement at once (make-before-break);
- when a noticed node's replacement is alive, the noticed node is drained now, so the join and
  the leave become one membership change;
- scale-down drains the most expensive healthy nodes first; drained nodes that left, and noticed
  nodes past their deadline, are terminated; VMs the provider reports gone are closed in the ledger;
- launches never push the burn rate past budget.max_per_hour; reaching budget.max_total drains and
  stops everything;
- a noticed node whose replacement is gone (died booting, joining or after the swap) counts as
  unreplaced again: another replacement is launched; a launch names the nodes just lost;
- a launch decided earlier but not finished (a crash between intent and result) is re-issued with
  its idempotency key, never as a new launch;
- warm spares (`nodes.spares`) stand outside the target: a gap in the target is filled by
  activating spares first (they join in about a second, a launch waits for a VM boot), then by
  launching; spares used up are launched again, spares no longer wanted are terminated;
- once the training job finished (a node reports it), nothing is launched or activated any more
  and spares are terminated: they could only cost money.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Desired:
    target: int
    min: int
    max: int
    max_per_hour: float | None = None
    max_total: float | None = None
    launch_price: float = 0.0  # $/h of the cheapest usable offer, for the budget check
    spares: int = 0  # warm standby VMs kept besides the target


@dataclass(frozen=True)
class NodeView:
    """One instance as the controller sees it, merged from the provider and etcd."""

    id: str
    price_per_hour: float
    gone: bool = False  # the provider says preempted, terminated or failed
    alive: bool = False  # its agent holds a liveness lease
    ready: bool = False  # it can take over work now (training: waiting to join or training)
    noticed: bool = False  # a preemption notice is recorded
    notice_deadline: float | None = None
    leaving: bool = False  # drain requested or notice acted upon
    left: bool = False  # its agent reports it left the training job
    ledger_open: bool = True
    launched_at: float = 0.0
    replaces: str | None = None  # the noticed node this one was launched for
    standby: bool = False  # a warm spare, parked outside the training job
    finished: bool = False  # its agent reports the training job finished


@dataclass(frozen=True)
class Observed:
    nodes: list[NodeView]
    spent_total: float = 0.0
    # (idempotency key, count, how many of its VMs the provider already shows) of an unfinished launch
    pending_launch: tuple[str, int, int] | None = None
    stopped: bool = False  # the cluster was stopped (budget); nothing is launched again
    now: float = 0.0


@dataclass(frozen=True)
class Launch:
    count: int
    reason: str
    key: str | None = None  # None: a new launch; the executor records a fresh key before calling
    replaces: tuple[str, ...] = ()
    standby: int = 0  # how many of the `count` VMs become warm spares
    lost: tuple[str, ...] = ()  # for people: the nodes just lost that this launch makes up for


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str


@dataclass(frozen=True)
class Activate:
    """A warm spare joins the training job."""

    node: str
    reason: str


@dataclass(frozen=True)
class Terminate:
    node: str
    reason: str


@dataclass(frozen=True)
class CloseLedger:
    node: str
    reason: str


@dataclass(frozen=True)
class StopCluster:
    reason: str


@dataclass(frozen=True)
class Blocked:
    """A launch the budget did not allow; recorded as an event, nothing else."""

    wanted: int
    allowed: int
    reason: str


Action = Launch | Activate | Drain | Terminate | CloseLedger | StopCluster | Blocked


@dataclass
class _Plan:
    actions: list[Action] = field(default_factory=list)

    def add(self, action: Action) -> None:
        self.actions.append(action)


def _counts(node: NodeView) -> bool:
    """Does this node count toward the target (running or coming up, staying)?"""
    return not (node.gone or node.noticed or node.leaving)


def plan(desired: Desired, observed: Observed) -> list[Action]:
    """The actions that move the observed cluster toward the desired one; idempotent."""
    out = _Plan()
    live = [n for n in observed.nodes if not n.gone]
    for node in observed.nodes:
        if node.gone and node.ledger_open:
            out.add(CloseLedger(node.id, "the provider reports the VM gone"))
    if desired.max_total is not None and observed.spent_total >= desired.max_total:
        if not observed.stopped:
            out.add(StopCluster(f"budget: spent {observed.spent_total:.4f} $ >= max_total {desired.max_total} $"))
        for node in live:
            _drain_or_terminate(out, node, "budget max_total reached", observed.now)
        return out.actions
    if observed.stopped:
        return out.actions
    _retire(out, live, observed.now)
    if any(n.finished for n in live):
        for node in live:
            if node.standby:
                out.add(Terminate(node.id, "training finished: the spare is no longer needed"))
        return out.actions
    _swap_replaced(out, live)
    staying = [n for n in live if _counts(n) and not n.standby]
    spares = [n for n in live if _counts(n) and n.standby]
    gap = desired.target - len(staying)
    unreplaced = [n.id for n in live if n.noticed and not _replaced(n, live)]
    if gap > 0 and spares:
        gap, spares, unreplaced = _activate(out, spares, gap, unreplaced)
    spare_gap = desired.spares - len(spares)
    if observed.pending_launch is not None:
        key, count, visible = observed.pending_launch
        out.add(Launch(count, "resume an unfinished launch", key=key))
        missing = count - visible  # the visible ones are already among `staying` or `spares`
        taken = min(max(gap, 0), missing)
        gap, spare_gap = gap - taken, spare_gap - (missing - taken)
    if gap > 0 or spare_gap > 0:
        _launch(out, desired, observed.nodes, max(gap, 0), max(spare_gap, 0), unreplaced)
    if gap < 0:
        for node in sorted(staying, key=lambda n: (-n.price_per_hour, -n.launched_at))[:-gap]:
            out.add(Drain(node.id, f"drain: scale down to {desired.target}"))
    if spare_gap < 0:
        for node in sorted(spares, key=lambda n: (-n.price_per_hour, -n.launched_at))[:-spare_gap]:
            out.add(Terminate(node.id, f"spare not needed: nodes.spares is {desired.spares}"))
    return out.actions


def _activate(
    out: _Plan, spares: list[NodeView], gap: int, unreplaced: list[str]
) -> tuple[int, list[NodeView], list[str]]:
    """Fill the gap with spares, those already up (agent alive) and oldest first; returns what is
    left of the gap, of the spares and of the noticed nodes still without a replacement."""
    chosen = sorted(spares, key=lambda n: (not n.alive, n.launched_at))[:gap]
    for node in chosen:
        why = f"replace noticed {unreplaced[0]}" if unreplaced else "fill the target"
        out.add(Activate(node.id, f"warm spare activated: {why}"))
        unreplaced = unreplaced[1:]
    return gap - len(chosen), [n for n in spares if n not in chosen], unreplaced


def _retire(out: _Plan, live: list[NodeView], now: float) -> None:
    for node in live:
        if node.left:
            out.add(Terminate(node.id, "left the training job"))
        elif node.noticed and node.notice_deadline is not None and now >= node.notice_deadline:
            out.add(Terminate(node.id, "preemption deadline passed"))


def _replaced(node: NodeView, live: list[NodeView]) -> bool:
    return any(other.replaces == node.id for other in live)


def _swap_replaced(out: _Plan, live: list[NodeView]) -> None:
    """A noticed node whose replacement is alive leaves now: one membership change for both."""
    for node in live:
        if (
            node.noticed
            and not node.leaving
            and not node.left
            and any(other.replaces == node.id and other.ready for other in live)
        ):
            out.add(Drain(node.id, "drain: replacement ready"))


def _launch(out: _Plan, desired: Desired, nodes: list[NodeView], gap: int, spare_gap: int, noticed: list[str]) -> None:
    live = [n for n in nodes if not n.gone]
    # A dying noticed node does not block its replacement; spares stand outside nodes.max.
    room = desired.max - len([n for n in live if _counts(n) and not n.standby])
    wanted = min(gap, max(0, room)) + spare_gap
    allowed = wanted
    if desired.max_per_hour is not None and desired.launch_price > 0:
        burn = sum(n.price_per_hour for n in live)
        allowed = min(wanted, max(0, int((desired.max_per_hour - burn + 1e-9) // desired.launch_price)))
        if allowed < wanted:
            out.add(
                Blocked(
                    wanted,
                    allowed,
                    f"budget: burn {burn:.4f} $/h + {wanted} x {desired.launch_price:.4f} "
                    f"$/h would pass max_per_hour {desired.max_per_hour}",
                )
            )
    if allowed > 0:
        active = min(allowed, wanted - spare_gap)  # the budget allows training nodes first
        standby = allowed - active
        lost = _lost(nodes) if active else ()
        if active:
            reason = f"replace noticed {', '.join(noticed)}" if noticed else f"reach target {desired.target}"
            reason += f"; lost {', '.join(lost)}" if lost else ""
        else:
            reason = f"keep {desired.spares} warm spare{'s' if desired.spares != 1 else ''}"
        out.add(Launch(allowed, reason, replaces=tuple(noticed[:active]), standby=standby, lost=lost))


def _lost(nodes: list[NodeView]) -> tuple[str, ...]:
    """The training nodes (or replacements coming up) the provider reports gone since the last pass
    (their ledger is still open), for the launch that makes up for them: "n3 (replacement of n2)"."""
    return tuple(
        f"{n.id} (replacement of {n.replaces})" if n.replaces else n.id
        for n in nodes
        if n.gone and n.ledger_open and not n.standby
    )


def _drain_or_terminate(out: _Plan, node: NodeView, why: str, now: float) -> None:
    if node.left or not node.alive:
        out.add(Terminate(node.id, why))
    elif not node.leaving:
        out.add(Drain(node.id, f"drain: {why}"))
