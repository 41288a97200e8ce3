"""The recipe's constrained value types: strict numbers, non-empty strings, environment variable
names and values, etcd endpoints, and paths relative to the recipe's directory.

Each validator raises spotrun.recipe.diagnostics.fail with the user-facing message and hint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo

from spotrun.recipe.diagnostics import fail, show

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENDPOINT = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]+)/?"
)


class FrozenModel(BaseModel):
    """The base of every recipe model: an unknown key is an error, and a validated value never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


StrictInt = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
StrictBool = Annotated[bool, Strict()]


def _non_empty(value: str) -> str:
    if not value.strip():
        raise fail("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise fail(
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
        raise fail("value is empty", "write '' for an empty string")
    if not isinstance(value, str):
        raise fail(f"expected a string, number or boolean, got {show(value)}")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]


def resolve_path(value: Path, info: ValidationInfo, *, want_dir: bool, what: str) -> Path:
    """Resolve `value` against the recipe's directory and check it, when validating a file."""
    base = (info.context or {}).get("base_dir")
    if base is None:
        return value
    resolved = (Path(base) / value.expanduser()).resolve()
    hint = f"{what} is relative to the recipe's directory {str(base)!r}"
    if not resolved.exists():
        raise fail(f"{str(value)!r} does not exist (resolved to {str(resolved)!r})", hint)
    if want_dir and not resolved.is_dir():
        raise fail(f"{str(value)!r} is not a directory", hint)
    if not want_dir and not resolved.is_file():
        raise fail(f"{str(value)!r} is not a file", hint)
    return resolved


def _endpoint(value: Any) -> Any:
    hint = "write host:port or https://host:port, e.g. 10.0.0.5:2379"
    if not isinstance(value, str):
        raise fail(f"expected a string, got {show(value)}", hint)
    match = _ENDPOINT.fullmatch(value.strip())
    if not match:
        raise fail(f"endpoint {value!r} is not host:port or https://host:port", hint)
    scheme = match["scheme"]
    if scheme is not None and scheme not in ("http", "https"):
        raise fail(f"endpoint {value!r} has scheme {scheme!r}", "use https:// or http://, or no scheme")
    if not 1 <= int(match["port"]) <= 65535:
        raise fail(f"endpoint {value!r} has port {match['port']} outside 1-65535", hint)
    return value.strip()


Endpoint = Annotated[str, BeforeValidator(_endpoint)]
