"""From a YAML file and a pydantic model to problem lines with hints: `FILE:LINE:COL: field.path: message (hint)`.

Validators raise `fail(message, hint, at)`; `check_file` reads the file (spotrun.recipe.yaml_positions
keeps every key's and value's position), validates it and translates each pydantic error into a
`Problem` at the offending key or value, with a hint where one helps (a close key name, quoting
YAML booleans, removing quotes around a number). Knows no recipe field: the model to check is an
argument (spotrun.recipe.schema binds it to `Recipe`).

Only pydantic, PyYAML and the standard library are imported: this module is on the CLI path.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from spotrun.recipe.yaml_positions import Document, PathKey, Pos, Problem, format_path, read_document, read_text

M = TypeVar("M", bound=BaseModel)


def fail(message: str, hint: str | None = None, at: tuple[PathKey, ...] = ()) -> PydanticCustomError:
    """A validation error whose message is used as is; `at` points below the validated value."""
    return PydanticCustomError("recipe", "{message}", {"message": message, "hint": hint, "at": at})


def show(value: Any) -> str:
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


def names(options: typing.Iterable[str]) -> str:
    """Names for a message: 'local', or 'a' or 'b'."""
    return " or ".join(repr(name) for name in options)


def did_you_mean(word: str, options: typing.Iterable[str]) -> str | None:
    """A "did you mean ...?" hint naming the closest of `options`, or None when none is close."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def choice(value: Any, options: tuple[str, ...], what: str) -> str:
    """`value` if it is one of `options`; else raises `fail` naming the `what` and the options."""
    if not isinstance(value, str):
        raise fail(f"expected a string, got {show(value)}", f"one of: {', '.join(options)}")
    if value not in options:
        hint = did_you_mean(value, options) or f"one of: {', '.join(options)}"
        raise fail(f"unknown {what} {value!r}", hint)
    return value


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


def _model_at(root: type[BaseModel], path: tuple[PathKey, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `path` below `root` (list indices are skipped)."""
    model: type[BaseModel] | None = root
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
        in_dict = isinstance(data, dict) and isinstance(part, str) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if (in_dict or in_list) and not rest:
            data = data[part]
            path.append(part)
        else:
            rest.append(part)
    return tuple(path), rest


def _problem(error: Any, doc: Document, root: type[BaseModel]) -> Problem | None:
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

    hint: str | None
    if kind == "missing" and rest:
        field = rest[-1]
        parent = format_path(path)
        hint = f"add '{field}:' under {parent}" if parent else f"add '{field}:' at the top level"
        return Problem(at_key(), format_path((*path, field)), "required field is missing", hint)
    if kind == "extra_forbidden":
        unknown = str(path[-1]) if path else str(rest[-1] if rest else "?")
        model = _model_at(root, path[:-1])
        allowed = list(model.model_fields) if model else []
        hint = did_you_mean(unknown, allowed) or (f"allowed keys: {', '.join(allowed)}" if allowed else None)
        return Problem(at_key(), format_path(path), f"unknown key {unknown!r}", hint)
    pos = at_key() if key_error else at_value()
    field = format_path(path)
    if kind == "recipe":
        return Problem(pos, field, str(ctx.get("message") or error["msg"]), ctx.get("hint"))
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
        hint = None
        if expected == "a mapping":
            model = _model_at(root, path)
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
        return Problem(pos, field, f"expected {expected}, got {show(value)}", hint)
    if kind in _LIMITS:
        limit = next(iter(ctx.values()), "?")
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return Problem(pos, field, f"must be {_LIMITS[kind]} {limit}, got {show(value)}")
    if kind in ("too_short", "string_too_short"):
        return Problem(pos, field, "must not be empty" if ctx.get("min_length", 1) <= 1 else error["msg"])
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return Problem(pos, field, message)


@dataclass(frozen=True)
class RecipeCheck(Generic[M]):
    """The outcome of checking one file: the recipe when valid, else the problem lines."""

    path: Path
    recipe: M | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when the file is a valid recipe."""
        return not self.problems


def check_file(path: Path, model: type[M]) -> RecipeCheck[M]:
    """Read one file and validate it as `model`; never raises for a bad or missing file. Validators
    get the file's directory as the `base_dir` context (paths in the file are relative to it)."""
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
            recipe = model.model_validate(doc.data, context={"base_dir": path.parent.resolve()})
        except ValidationError as exc:
            found = (_problem(error, doc, model) for error in exc.errors(include_url=False))
            problems += [problem for problem in found if problem is not None]
    lines: list[str] = []
    for item in sorted(problems, key=lambda p: (p.pos.line, p.pos.col)):
        line = item.render(shown)
        if line not in lines:
            lines.append(line)
    return RecipeCheck(path, None if lines else recipe, lines)
