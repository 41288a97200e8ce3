"""The recipe: one YAML file that says what to train, where, on how many nodes, at what price.

`load_recipe(path)` returns a validated, frozen `Recipe` or raises `RecipeError` whose
`problems` hold every problem of the file at once, one line each:

    FILE:LINE:COL: field.path: message (hint)

LINE and COL are 1-based and point at the offending key or value (at the parent mapping for a
missing field; 1:1 where the file has no position, e.g. when it cannot be read).
`check_files(paths)` does the same for many files without raising (`spotrun validate`).

Paths in a recipe (`workdir`, `control_plane.tls.*`) are relative to the recipe file's
directory. They are resolved and checked only when validation gets a `base_dir` context, as
`load_recipe` does; the copy stored in etcd (`to_json()`, read back by spotrun.state.spec or
`Recipe.from_json`) is validated without one: it trusts the absolute paths it holds and touches
no file.

The models live here and in spotrun.recipe.job (nodes, checkpoint, budget, chaos); their value
types in spotrun.recipe.fields; the translation of validation errors into those lines, with
hints, in spotrun.recipe.diagnostics.

Only pydantic, PyYAML, the standard library and the provider registry (spotrun.providers, which
loads no SDK) are imported: this module is on the CLI path.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from spotrun.errors import RecipeError
from spotrun.providers import Feature, has_feature, known_providers, provider_package, with_feature
from spotrun.recipe import diagnostics
from spotrun.recipe.diagnostics import RecipeCheck, choice, fail, names, show
from spotrun.recipe.fields import (
    Endpoint,
    EnvName,
    EnvValue,
    FrozenModel,
    NonEmptyStr,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    StrictBool,
    resolve_path,
)
from spotrun.recipe.job import Budget, Chaos, Checkpoint, Nodes, Preemption

__all__ = [
    "TLS",
    "Accelerator",
    "Budget",
    "Chaos",
    "Checkpoint",
    "ControlPlane",
    "Nodes",
    "Preemption",
    "Prices",
    "Recipe",
    "RecipeCheck",
    "ResourceCandidate",
    "check_file",
    "check_files",
    "load_recipe",
]

PROVIDERS = tuple(known_providers())
CONTROL_PLANE_MODES = ("embedded", "external", "head")
NAME_MAX = 40

Provider = str  # one of PROVIDERS: the `_provider` validators check it

_NAME = re.compile(r"[a-z][a-z0-9-]*")
_ACCEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# --- the models ----------------------------------------------------------------------------


class Accelerator(FrozenModel):
    """GPUs per VM, e.g. `A100:8`. Written as "A100:8", "A100" (one) or `{A100: 8}`."""

    name: str
    count: PositiveInt = 1

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        hint = "write it as 'A100:8', 'A100' or {A100: 8}"
        if isinstance(value, str):
            name, sep, count_text = value.strip().partition(":")
            if not sep:
                count_text = "1"
            try:
                count = int(count_text.strip())
            except ValueError:
                raise fail(f"accelerator count in {value!r} is not an integer", hint) from None
            value = {"name": name.strip(), "count": count}
        elif isinstance(value, dict):
            if not (set(value) <= {"name", "count"} and isinstance(value.get("name"), str)):  # else {A100: 8}
                if len(value) != 1:
                    raise fail(f"expected one accelerator type, got {len(value)}: {', '.join(map(str, value))}", hint)
                ((name, count),) = value.items()
                if isinstance(count, bool) or not isinstance(count, int):
                    raise fail(f"accelerator count for {name!r} must be an integer, got {show(count)}", hint)
                value = {"name": str(name), "count": count}
        else:
            raise fail(f"expected a string or a mapping, got {show(value)}", hint)
        if not _ACCEL_NAME.fullmatch(value["name"]):
            raise fail(f"accelerator name {value['name']!r} is not valid", hint)
        if isinstance(value.get("count"), int) and value["count"] < 1:
            raise fail(f"accelerator count must be >= 1, got {value['count']}", hint)
        return value

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


class Prices(FrozenModel):
    """$/h for one VM of this type; the local provider's price table reads them."""

    spot: PositiveFloat
    on_demand: PositiveFloat


class ResourceCandidate(FrozenModel):
    """One kind of VM that may run the job; candidates are tried in the order written."""

    provider: Provider
    region: str | None = None
    zone: str | None = None
    instance_type: NonEmptyStr
    accelerators: Accelerator | None = None
    workers: PositiveInt | None = None  # training workers per VM; default: one per accelerator
    spot: StrictBool = True
    max_price: PositiveFloat | None = None
    prices: Prices | None = None
    boot_s: NonNegativeFloat | None = None  # local only: emulate a cloud VM's launch-to-SSH time

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        return choice(value, PROVIDERS, "provider")

    @property
    def workers_per_vm(self) -> int:
        """Training workers on each VM of this candidate: `workers` if set, else one per
        accelerator (a worker drives one GPU), else 1 on a CPU VM."""
        if self.workers is not None:
            return self.workers
        return self.accelerators.count if self.accelerators else 1

    @model_validator(mode="after")
    def _boot_s_local_only(self) -> ResourceCandidate:
        if self.boot_s is not None and not has_feature(self.provider, Feature.RECIPE_PRICES):
            raise fail(
                f"boot_s is only for provider {names(with_feature(Feature.RECIPE_PRICES))}"
                " (it emulates a cloud VM's boot time)",
                "remove boot_s: real clouds take the time they take",
                ("boot_s",),
            )
        return self

    @model_validator(mode="after")
    def _zone_in_region(self) -> ResourceCandidate:
        suffix = provider_package(self.provider).catalog.ZONE_SUFFIX
        if suffix is not None and self.region and self.zone and not self.zone.startswith(self.region):
            example = self.region + suffix
            raise fail(
                f"zone {self.zone!r} is not in region {self.region!r}",
                f"{self.provider} zone names start with their region, e.g. {example}",
                ("zone",),
            )
        return self


class TLS(FrozenModel):
    """Files for talking TLS to an external etcd; relative to the recipe's directory."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @field_validator("ca", "cert", "key", mode="after")
    @classmethod
    def _exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info, want_dir=False, what=f"tls.{info.field_name}")

    @model_validator(mode="after")
    def _pairs(self) -> TLS:
        if (self.cert is None) != (self.key is None):
            missing = "key" if self.key is None else "cert"
            raise fail(
                f"tls.cert and tls.key go together; tls.{missing} is missing", None, ("cert" if self.cert else "key",)
            )
        if self.ca is None and self.cert is None:
            raise fail("needs ca, or cert and key", "remove tls to use plain connections")
        return self


class Head(FrozenModel):
    """The small on-demand VM that holds etcd and the controller in mode 'head'. `provider`
    defaults to the first resource candidate's; `zone` to that provider's cheapest offer."""

    instance_type: NonEmptyStr
    provider: Provider | None = None
    zone: str | None = None

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        return None if value is None else choice(value, PROVIDERS, "provider")


class ControlPlane(FrozenModel):
    """Where etcd and the controller live: embedded on this machine, an existing etcd
    (external), or a head VM that spotrun starts next to the workers (head)."""

    mode: Literal["embedded", "external", "head"] = "embedded"
    endpoints: tuple[Endpoint, ...] = ()
    tls: TLS | None = None
    head: Head | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return choice(value, CONTROL_PLANE_MODES, "control plane mode")

    @model_validator(mode="after")
    def _endpoints_iff_external(self) -> ControlPlane:
        if self.mode == "external" and not self.endpoints:
            raise fail("mode 'external' needs at least one endpoint", "add endpoints: [etcd-host:2379]", ("mode",))
        if self.mode == "embedded" and self.endpoints:
            raise fail(
                "endpoints are only used with mode 'external'",
                "set mode: external, or remove endpoints",
                ("endpoints",),
            )
        if self.mode != "external" and self.tls is not None:
            raise fail("tls is only used with mode 'external'", "set mode: external, or remove tls", ("tls",))
        if self.mode == "head" and self.endpoints:
            raise fail(
                "endpoints are only used with mode 'external'",
                "mode 'head' starts its own etcd; remove endpoints",
                ("endpoints",),
            )
        if self.mode == "head" and self.head is None:
            raise fail("mode 'head' needs a head VM", "add head: {instance_type: t3.small}", ("mode",))
        if self.mode != "head" and self.head is not None:
            raise fail("head is only used with mode 'head'", "set mode: head, or remove head", ("head",))
        return self


def _cluster_name(value: Any) -> Any:
    hint = "lowercase letters, digits and dashes, starting with a letter, at most 40 characters"
    if not isinstance(value, str):
        raise fail(f"expected a string, got {show(value)}", hint)
    if not value:
        raise fail("must not be empty", hint)
    if len(value) > NAME_MAX:
        raise fail(f"name {value!r} is {len(value)} characters long; at most {NAME_MAX} are allowed", hint)
    if not _NAME.fullmatch(value) or value.endswith("-"):
        suggestion = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
        suggestion = re.sub(r"^[^a-z]+", "", suggestion)[:NAME_MAX].rstrip("-")
        if suggestion and suggestion != value:
            hint = f"try {suggestion!r}; {hint}, not ending with a dash"
        else:
            hint = f"{hint}, not ending with a dash"
        raise fail(f"name {value!r} is not a valid cluster name", hint)
    return value


ClusterName = Annotated[str, BeforeValidator(_cluster_name)]


class Recipe(FrozenModel):
    """A validated recipe. Frozen; `to_json()`/`from_json()` round-trip (stored in etcd)."""

    name: ClusterName
    resources: tuple[ResourceCandidate, ...]
    nodes: Nodes
    workdir: Path = Field(default=Path("."), validate_default=True)
    setup: str | None = None
    run: NonEmptyStr
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    budget: Budget | None = None
    control_plane: ControlPlane = Field(default_factory=ControlPlane)
    chaos: Chaos | None = None

    @field_validator("resources", mode="before")
    @classmethod
    def _some_resources(cls, value: Any) -> Any:
        # Checked here, not with min_length: pydantic reports a too_short tuple when only its items fail.
        if isinstance(value, (list, tuple)) and not value:
            raise fail(
                "must list at least one resource candidate", "e.g. - {provider: local, instance_type: cpu-small}"
            )
        return value

    @field_validator("workdir", mode="after")
    @classmethod
    def _workdir(cls, value: Path, info: ValidationInfo) -> Path:
        return resolve_path(value, info, want_dir=True, what="workdir")

    @model_validator(mode="after")
    def _chaos_rules(self) -> Recipe:
        if self.chaos is None:
            return self
        for index, resource in enumerate(self.resources):
            if not has_feature(resource.provider, Feature.CHAOS):
                raise fail(
                    f"chaos is only allowed when every resource uses provider {names(with_feature(Feature.CHAOS))}; "
                    f"resources[{index}].provider is {resource.provider!r}",
                    "remove chaos, or inject preemptions on clouds with `spotrun preempt`",
                    ("chaos",),
                )
        for index, event in enumerate(self.chaos.preempt):
            if isinstance(event.node, int) and event.node >= self.nodes.max:
                raise fail(
                    f"chaos.preempt[{index}].node ({event.node}) must be < nodes.max ({self.nodes.max})",
                    "nodes are numbered from 0",
                    ("chaos", "preempt", index, "node"),
                )
        return self

    @model_validator(mode="after")
    def _control_plane_reachable(self) -> Recipe:
        head = self.control_plane.head
        if head is not None and not has_feature(head.provider or self.resources[0].provider, Feature.HEAD_VM):
            raise fail(
                "the head VM must be on a cloud provider",
                "local clusters keep etcd on this machine: use mode embedded",
                ("control_plane", "head"),
            )
        clouds = sorted(p for p in self.providers if not has_feature(p, Feature.EMBEDDED_ETCD))
        if self.control_plane.mode == "embedded" and clouds:
            raise fail(
                f"{clouds[0]} VMs cannot reach the embedded etcd, which listens on this machine's loopback",
                "add control_plane: {mode: head, head: {instance_type: t3.small}}, or mode external",
                ("resources",),
            )
        return self

    @property
    def providers(self) -> frozenset[str]:
        """The providers the candidates use."""
        return frozenset(r.provider for r in self.resources)

    def to_json(self) -> str:
        """The recipe as JSON (what `/spotrun/<cluster>/spec` holds)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Recipe:
        """Read back `to_json()` output. Paths are taken as stored; no file is touched.

        Raises:
            pydantic.ValidationError: the JSON is not a valid recipe.
        """
        return cls.model_validate_json(text)


# --- files ---------------------------------------------------------------------------------


def check_file(path: Path) -> RecipeCheck[Recipe]:
    """Read and validate one recipe file; never raises for a bad or missing file."""
    return diagnostics.check_file(Path(path), Recipe)


def check_files(paths: typing.Iterable[Path]) -> list[RecipeCheck[Recipe]]:
    """`check_file` for each path, in order."""
    return [check_file(Path(p)) for p in paths]


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe file.

    Raises:
        RecipeError: the file is missing, unreadable or invalid; `problems` has every problem,
            one `FILE:LINE:COL: field: message (hint)` line each.
    """
    check = check_file(path)
    if check.recipe is None:
        raise RecipeError(check.problems)
    return check.recipe
