"""The parts of a recipe the controller and the agents act on while the job runs: how many nodes
train (and how many warm spares wait), how often the trainer checkpoints, the spending caps, and
the preemptions injected to rehearse (chaos).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, ValidationInfo, field_validator, model_validator

from spotrun.recipe.diagnostics import fail, show
from spotrun.recipe.fields import (
    FrozenModel,
    NonEmptyStr,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    StrictInt,
    resolve_path,
)


class Nodes(FrozenModel):
    """How many VMs train: never fewer than `min`, never more than `max`, aiming at `target`; plus
    `spares` warm standby VMs."""

    min: Annotated[int, Strict(), Field(ge=1)]
    max: PositiveInt
    target: StrictInt = Field(default=None, validate_default=False)  # type: ignore[assignment]  # min when omitted
    # Warm spares: booted, bootstrapped, launcher pre-warmed, parked outside the training job and
    # billed like any VM. A preempted node's place goes to a spare in about a second instead of a
    # VM boot; the controller then launches a new spare. Not counted in min/max/target.
    spares: Annotated[int, Strict(), Field(ge=0)] = 0

    @model_validator(mode="after")
    def _order(self) -> Nodes:
        if self.min > self.max:
            raise fail(f"nodes.min ({self.min}) must be <= nodes.max ({self.max})", None, ("min",))
        if self.target is None:
            object.__setattr__(self, "target", self.min)  # frozen; filled in once, at validation
        elif not self.min <= self.target <= self.max:
            raise fail(
                f"nodes.target ({self.target}) must be between nodes.min ({self.min}) and nodes.max ({self.max})",
                "omit target to start with nodes.min",
                ("target",),
            )
        return self


class Checkpoint(FrozenModel):
    """How often the trainer checkpoints; `dir` is relative to the workdir on each VM."""

    dir: NonEmptyStr = "checkpoints"
    every_steps: PositiveInt | None = None
    every_seconds: PositiveFloat | None = None
    keep: Annotated[int, Strict(), Field(ge=1)] = 3

    @model_validator(mode="after")
    def _some_interval(self) -> Checkpoint:
        if self.every_steps is None and self.every_seconds is None:
            raise fail("needs every_steps or every_seconds (or both)", "e.g. every_steps: 100")
        return self


class Budget(FrozenModel):
    """Spending caps in $ that the controller enforces: per hour for the cluster, and in total."""

    max_per_hour: PositiveFloat | None = None
    max_total: PositiveFloat | None = None

    @model_validator(mode="after")
    def _some_cap(self) -> Budget:
        if self.max_per_hour is None and self.max_total is None:
            raise fail("needs max_per_hour or max_total (or both)", "remove budget for no cap")
        return self


class Preemption(FrozenModel):
    """One injected preemption: `at` seconds after start, on `node` (index or "random")."""

    at: NonNegativeFloat
    node: StrictInt | Literal["random"] = "random"
    notice: NonNegativeFloat = 30.0

    @field_validator("node", mode="before")
    @classmethod
    def _node(cls, value: Any) -> Any:
        hint = "nodes are numbered from 0"
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise fail(f"expected a node index or 'random', got {show(value)}", hint)
        if isinstance(value, str) and value != "random":
            raise fail(f"expected a node index or 'random', got {value!r}", hint)
        if isinstance(value, int) and value < 0:
            raise fail(f"node index must be >= 0, got {value}", hint)
        return value


class Chaos(FrozenModel):
    """A preemption schedule for the local provider, to rehearse what spot VMs will do: explicit
    `preempt` entries, and/or a spot `trace` (spot-traces JSON) replayed at `time_scale` (0.01
    plays a 300 s tick in 3 s): capacity drops preempt the newest VMs with `trace_notice` seconds
    of warning, and the local cloud refuses launches beyond the trace's capacity."""

    preempt: tuple[Preemption, ...] = ()
    trace: Path | None = None
    time_scale: PositiveFloat = 1.0
    trace_notice: NonNegativeFloat = 30.0

    @field_validator("trace", mode="after")
    @classmethod
    def _trace_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info, want_dir=False, what="chaos.trace")
