"""The recipe: one YAML file that says what to train, where, on how many nodes, at what price.

`load_recipe(path)` returns a validated, frozen `Recipe` or raises `RecipeError` whose
`problems` hold every problem of the file at once, one line each:

    FILE:LINE:COL: field.path: message (hint)

LINE and COL are 1-based and point at the offending key or value (at the parent mapping for a
missing field; 1:1 where the file has no position, e.g. when it cannot be read).
`check_files(paths)` does the same for many files without raising (`spotrun validate`).

Paths in a recipe (`workdir`, `control_plane.tls.*`) are relative to the recipe file's
directory. They are resolved and checked only when validation gets a `base_dir` context, as
`load_recipe` does; `Recipe.from_json` (the copy stored in etcd) trusts the absolute paths
it holds and touches no file.

Only pydantic, PyYAML, the standard library and the provider registry (spotrun.providers, which
loads no SDK) are imported: this module is on the CLI path.
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from spotrun.errors import RecipeError
from spotrun.providers import Feature, has_feature, known_providers, provider_package, with_feature
from spotrun.recipe.yaml_positions import Document, PathKey, Pos, Problem, format_path, read_document, read_text

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
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ACCEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ENDPOINT = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]+)/?"
)


def _fail(message: str, hint: str | None = None, at: tuple[PathKey, ...] = ()) -> PydanticCustomError:
    """A validation error whose message is used as is; `at` points below the validated value."""
    return PydanticCustomError("recipe", "{message}", {"message": message, "hint": hint, "at": at})


def _show(value: Any) -> str:
    """A user-facing rendering of a YAML value, for "got ..." in messages."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _names(names: typing.Iterable[str]) -> str:
    """Provider names for a message: 'local', or 'a' or 'b'."""
    return " or ".join(repr(name) for name in names)


def _did_you_mean(word: str, options: typing.Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _choice(value: Any, options: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str):
        raise _fail(f"expected a string, got {_show(value)}", f"one of: {', '.join(options)}")
    if value not in options:
        hint = _did_you_mean(value, options) or f"one of: {', '.join(options)}"
        raise _fail(f"unknown {what} {value!r}", hint)
    return value


# --- small constrained types ---------------------------------------------------------------

StrictInt = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
StrictBool = Annotated[bool, Strict()]


def _non_empty(value: str) -> str:
    if not value.strip():
        raise _fail("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise _fail(
            f"{value!r} is not a valid environment variable name",
            "use letters, digits and underscores, not starting with a digit",
        )
    return value


def _env_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        raise _fail("value is empty", "write '' for an empty string")
    if not isinstance(value, str):
        raise _fail(f"expected a string, number or boolean, got {_show(value)}")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]


def _resolve_path(value: Path, info: ValidationInfo, *, want_dir: bool, what: str) -> Path:
    """Resolve `value` against the recipe's directory and check it, when validating a file."""
    base = (info.context or {}).get("base_dir")
    if base is None:
        return value
    resolved = (Path(base) / value.expanduser()).resolve()
    hint = f"{what} is relative to the recipe's directory {str(base)!r}"
    if not resolved.exists():
        raise _fail(f"{str(value)!r} does not exist (resolved to {str(resolved)!r})", hint)
    if want_dir and not resolved.is_dir():
        raise _fail(f"{str(value)!r} is not a directory", hint)
    if not want_dir and not resolved.is_file():
        raise _fail(f"{str(value)!r} is not a file", hint)
    return resolved


# --- the models ----------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Accelerator(_Model):
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
                raise _fail(f"accelerator count in {value!r} is not an integer", hint) from None
            value = {"name": name.strip(), "count": count}
        elif isinstance(value, dict):
            if not (set(value) <= {"name", "count"} and isinstance(value.get("name"), str)):  # else {A100: 8}
                if len(value) != 1:
                    raise _fail(f"expected one accelerator type, got {len(value)}: {', '.join(map(str, value))}", hint)
                ((name, count),) = value.items()
                if isinstance(count, bool) or not isinstance(count, int):
                    raise _fail(f"accelerator count for {name!r} must be an integer, got {_show(count)}", hint)
                value = {"name": str(name), "count": count}
        else:
            raise _fail(f"expected a string or a mapping, got {_show(value)}", hint)
        if not _ACCEL_NAME.fullmatch(value["name"]):
            raise _fail(f"accelerator name {value['name']!r} is not valid", hint)
        if isinstance(value.get("count"), int) and value["count"] < 1:
            raise _fail(f"accelerator count must be >= 1, got {value['count']}", hint)
        return value

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


class Prices(_Model):
    """$/h for one VM of this type; the local provider's price table reads them."""

    spot: PositiveFloat
    on_demand: PositiveFloat


class ResourceCandidate(_Model):
    """One kind of VM that may run the job; candidates are tried in the order written."""

    provider: Provider
    region: str | None = None
    zone: str | None = None
    instance_type: NonEmptyStr
    accelerators: Accelerator | None = None
    spot: StrictBool = True
    max_price: PositiveFloat | None = None
    prices: Prices | None = None
    boot_s: NonNegativeFloat | None = None  # local only: emulate a cloud VM's launch-to-SSH time

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        return _choice(value, PROVIDERS, "provider")

    @model_validator(mode="after")
    def _boot_s_local_only(self) -> ResourceCandidate:
        if self.boot_s is not None and not has_feature(self.provider, Feature.RECIPE_PRICES):
            raise _fail(
                f"boot_s is only for provider {_names(with_feature(Feature.RECIPE_PRICES))}"
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
            raise _fail(
                f"zone {self.zone!r} is not in region {self.region!r}",
                f"{self.provider} zone names start with their region, e.g. {example}",
                ("zone",),
            )
        return self


class Nodes(_Model):
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
            raise _fail(f"nodes.min ({self.min}) must be <= nodes.max ({self.max})", None, ("min",))
        if self.target is None:
            object.__setattr__(self, "target", self.min)  # frozen; filled in once, at validation
        elif not self.min <= self.target <= self.max:
            raise _fail(
                f"nodes.target ({self.target}) must be between nodes.min ({self.min}) and nodes.max ({self.max})",
                "omit target to start with nodes.min",
                ("target",),
            )
        return self


class Checkpoint(_Model):
    """How often the trainer checkpoints; `dir` is relative to the workdir on each VM."""

    dir: NonEmptyStr = "checkpoints"
    every_steps: PositiveInt | None = None
    every_seconds: PositiveFloat | None = None
    keep: Annotated[int, Strict(), Field(ge=1)] = 3

    @model_validator(mode="after")
    def _some_interval(self) -> Checkpoint:
        if self.every_steps is None and self.every_seconds is None:
            raise _fail("needs every_steps or every_seconds (or both)", "e.g. every_steps: 100")
        return self


class Budget(_Model):
    """Spending caps in $ that the controller enforces: per hour for the cluster, and in total."""

    max_per_hour: PositiveFloat | None = None
    max_total: PositiveFloat | None = None

    @model_validator(mode="after")
    def _some_cap(self) -> Budget:
        if self.max_per_hour is None and self.max_total is None:
            raise _fail("needs max_per_hour or max_total (or both)", "remove budget for no cap")
        return self


class TLS(_Model):
    """Files for talking TLS to an external etcd; relative to the recipe's directory."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @field_validator("ca", "cert", "key", mode="after")
    @classmethod
    def _exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve_path(value, info, want_dir=False, what=f"tls.{info.field_name}")

    @model_validator(mode="after")
    def _pairs(self) -> TLS:
        if (self.cert is None) != (self.key is None):
            missing = "key" if self.key is None else "cert"
            raise _fail(
                f"tls.cert and tls.key go together; tls.{missing} is missing", None, ("cert" if self.cert else "key",)
            )
        if self.ca is None and self.cert is None:
            raise _fail("needs ca, or cert and key", "remove tls to use plain connections")
        return self


def _endpoint(value: Any) -> Any:
    hint = "write host:port or https://host:port, e.g. 10.0.0.5:2379"
    if not isinstance(value, str):
        raise _fail(f"expected a string, got {_show(value)}", hint)
    match = _ENDPOINT.fullmatch(value.strip())
    if not match:
        raise _fail(f"endpoint {value!r} is not host:port or https://host:port", hint)
    scheme = match["scheme"]
    if scheme is not None and scheme not in ("http", "https"):
        raise _fail(f"endpoint {value!r} has scheme {scheme!r}", "use https:// or http://, or no scheme")
    if not 1 <= int(match["port"]) <= 65535:
        raise _fail(f"endpoint {value!r} has port {match['port']} outside 1-65535", hint)
    return value.strip()


Endpoint = Annotated[str, BeforeValidator(_endpoint)]


class Head(_Model):
    """The small on-demand VM that holds etcd and the controller in mode 'head'. `provider`
    defaults to the first resource candidate's; `zone` to that provider's cheapest offer."""

    instance_type: NonEmptyStr
    provider: Provider | None = None
    zone: str | None = None

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        return None if value is None else _choice(value, PROVIDERS, "provider")


class ControlPlane(_Model):
    """Where etcd and the controller live: embedded on this machine, an existing etcd
    (external), or a head VM that spotrun starts next to the workers (head)."""

    mode: Literal["embedded", "external", "head"] = "embedded"
    endpoints: tuple[Endpoint, ...] = ()
    tls: TLS | None = None
    head: Head | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return _choice(value, CONTROL_PLANE_MODES, "control plane mode")

    @model_validator(mode="after")
    def _endpoints_iff_external(self) -> ControlPlane:
        if self.mode == "external" and not self.endpoints:
            raise _fail("mode 'external' needs at least one endpoint", "add endpoints: [etcd-host:2379]", ("mode",))
        if self.mode == "embedded" and self.endpoints:
            raise _fail(
                "endpoints are only used with mode 'external'",
                "set mode: external, or remove endpoints",
                ("endpoints",),
            )
        if self.mode != "external" and self.tls is not None:
            raise _fail("tls is only used with mode 'external'", "set mode: external, or remove tls", ("tls",))
        if self.mode == "head" and self.endpoints:
            raise _fail(
                "endpoints are only used with mode 'external'",
                "mode 'head' starts its own etcd; remove endpoints",
                ("endpoints",),
            )
        if self.mode == "head" and self.head is None:
            raise _fail("mode 'head' needs a head VM", "add head: {instance_type: t3.small}", ("mode",))
        if self.mode != "head" and self.head is not None:
            raise _fail("head is only used with mode 'head'", "set mode: head, or remove head", ("head",))
        return self


class Preemption(_Model):
    """One injected preemption: `at` seconds after start, on `node` (index or "random")."""

    at: NonNegativeFloat
    node: StrictInt | Literal["random"] = "random"
    notice: NonNegativeFloat = 30.0

    @field_validator("node", mode="before")
    @classmethod
    def _node(cls, value: Any) -> Any:
        hint = "nodes are numbered from 0"
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise _fail(f"expected a node index or 'random', got {_show(value)}", hint)
        if isinstance(value, str) and value != "random":
            raise _fail(f"expected a node index or 'random', got {value!r}", hint)
        if isinstance(value, int) and value < 0:
            raise _fail(f"node index must be >= 0, got {value}", hint)
        return value


class Chaos(_Model):
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
        return None if value is None else _resolve_path(value, info, want_dir=False, what="chaos.trace")


def _cluster_name(value: Any) -> Any:
    hint = "lowercase letters, digits and dashes, starting with a letter, at most 40 characters"
    if not isinstance(value, str):
        raise _fail(f"expected a string, got {_show(value)}", hint)
    if not value:
        raise _fail("must not be empty", hint)
    if len(value) > NAME_MAX:
        raise _fail(f"name {value!r} is {len(value)} characters long; at most {NAME_MAX} are allowed", hint)
    if not _NAME.fullmatch(value) or value.endswith("-"):
        suggestion = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
        suggestion = re.sub(r"^[^a-z]+", "", suggestion)[:NAME_MAX].rstrip("-")
        if suggestion and suggestion != value:
            hint = f"try {suggestion!r}; {hint}, not ending with a dash"
        else:
            hint = f"{hint}, not ending with a dash"
        raise _fail(f"name {value!r} is not a valid cluster name", hint)
    return value


ClusterName = Annotated[str, BeforeValidator(_cluster_name)]


class Recipe(_Model):
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
            raise _fail(
                "must list at least one resource candidate", "e.g. - {provider: local, instance_type: cpu-small}"
            )
        return value

    @field_validator("workdir", mode="after")
    @classmethod
    def _workdir(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_path(value, info, want_dir=True, what="workdir")

    @model_validator(mode="after")
    def _chaos_rules(self) -> Recipe:
        if self.chaos is None:
            return self
        for index, resource in enumerate(self.resources):
            if not has_feature(resource.provider, Feature.CHAOS):
                raise _fail(
                    f"chaos is only allowed when every resource uses provider {_names(with_feature(Feature.CHAOS))}; "
                    f"resources[{index}].provider is {resource.provider!r}",
                    "remove chaos, or inject preemptions on clouds with `spotrun preempt`",
                    ("chaos",),
                )
        for index, event in enumerate(self.chaos.preempt):
            if isinstance(event.node, int) and event.node >= self.nodes.max:
                raise _fail(
                    f"chaos.preempt[{index}].node ({event.node}) must be < nodes.max ({self.nodes.max})",
                    "nodes are numbered from 0",
                    ("chaos", "preempt", index, "node"),
                )
        return self

    @model_validator(mode="after")
    def _control_plane_reachable(self) -> Recipe:
        head = self.control_plane.head
        if head is not None and not has_feature(head.provider or self.resources[0].provider, Feature.HEAD_VM):
            raise _fail(
                "the head VM must be on a cloud provider",
                "local clusters keep etcd on this machine: use mode embedded",
                ("control_plane", "head"),
            )
        clouds = sorted(p for p in self.providers if not has_feature(p, Feature.EMBEDDED_ETCD))
        if self.control_plane.mode == "embedded" and clouds:
            raise _fail(
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


# --- files -> problems ---------------------------------------------------------------------

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path",
    "finite_number": "a finite number",
}

_LIMITS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _model_at(path: tuple[PathKey, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `path` (list indices are skipped)."""
    model: type[BaseModel] | None = Recipe
    for part in path:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _find_model(model.model_fields[part].annotation)
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def _resolve(data: Any, loc: tuple[Any, ...]) -> tuple[tuple[PathKey, ...], list[Any]]:
    """Split a pydantic loc into the part found in the data and the rest."""
    path: list[PathKey] = []
    rest: list[Any] = []
    for part in loc:
        if (isinstance(data, dict) and isinstance(part, str) and part in data and not rest) or (
            isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data) and not rest
        ):
            data = data[part]
            path.append(part)
        else:
            rest.append(part)
    return tuple(path), rest


def _problem(error: Any, doc: Document) -> Problem | None:
    """The Problem for one pydantic error, or None when it only echoes an unreadable value."""
    kind: str = error["type"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    value = error.get("input")
    loc = tuple(error["loc"])
    key_error = "[key]" in loc
    loc = tuple(part for part in loc if part != "[key]")
    if kind == "recipe":
        loc = loc + tuple(ctx.get("at") or ())
    path, rest = _resolve(doc.data, loc)
    if any(path[: len(bad)] == bad for bad in doc.unreadable):
        return None
    where = doc.where.get(path)

    def at_value() -> Pos:
        return where.best_for_value if where else Pos()

    def at_key() -> Pos:
        return (where.key or where.value) if where else Pos()

    if kind == "missing" and rest:
        field = rest[-1]
        parent = format_path(path)
        hint = f"add '{field}:' under {parent}" if parent else f"add '{field}:' at the top level"
        return Problem(at_key(), format_path((*path, field)), "required field is missing", hint)
    if kind == "extra_forbidden":
        unknown = str(path[-1]) if path else str(rest[-1] if rest else "?")
        model = _model_at(path[:-1])
        allowed = list(model.model_fields) if model else []
        hint = _did_you_mean(unknown, allowed) or (f"allowed keys: {', '.join(allowed)}" if allowed else None)
        return Problem(at_key(), format_path(path), f"unknown key {unknown!r}", hint)
    pos = at_key() if key_error else at_value()
    field = format_path(path)
    if kind == "recipe":
        return Problem(pos, field, str(ctx.get("message") or error["msg"]), ctx.get("hint"))
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        hint = None
        if expected == "a mapping":
            model = _model_at(path)
            if model is not None:
                expected = f"a mapping with keys {', '.join(model.model_fields)}"
        elif expected == "a list" and isinstance(value, dict):
            hint = "start each list item with '- '"
        elif isinstance(value, bool) and expected == "a string":
            hint = "YAML reads yes/no/on/off/true/false as booleans; quote the value"
        elif isinstance(value, str) and expected in ("an integer", "a number", "true or false"):
            hint = "remove the quotes"
        elif isinstance(value, float) and expected == "an integer":
            hint = "use a whole number"
        return Problem(pos, field, f"expected {expected}, got {_show(value)}", hint)
    if kind in _LIMITS:
        limit = next(iter(ctx.values()), "?")
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return Problem(pos, field, f"must be {_LIMITS[kind]} {limit}, got {_show(value)}")
    if kind in ("too_short", "string_too_short"):
        return Problem(pos, field, "must not be empty" if ctx.get("min_length", 1) <= 1 else error["msg"])
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return Problem(pos, field, message)


@dataclass(frozen=True)
class RecipeCheck:
    """The outcome of checking one file: the recipe when valid, else the problem lines."""

    path: Path
    recipe: Recipe | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when the file is a valid recipe."""
        return not self.problems


def check_file(path: Path) -> RecipeCheck:
    """Read and validate one recipe file; never raises for a bad or missing file."""
    path = Path(path)
    shown = str(path)
    text, problem = read_text(path)
    if problem is not None:
        return RecipeCheck(path, None, [problem.render(shown)])
    doc = read_document(text or "")
    problems = list(doc.problems)
    recipe = None
    if doc.data is not None:
        try:
            recipe = Recipe.model_validate(doc.data, context={"base_dir": path.parent.resolve()})
        except ValidationError as exc:
            found = (_problem(error, doc) for error in exc.errors(include_url=False))
            problems += [problem for problem in found if problem is not None]
    lines: list[str] = []
    for item in sorted(problems, key=lambda p: (p.pos.line, p.pos.col)):
        line = item.render(shown)
        if line not in lines:
            lines.append(line)
    return RecipeCheck(path, None if lines else recipe, lines)


def check_files(paths: typing.Iterable[Path]) -> list[RecipeCheck]:
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
