"""Read a recipe file into plain Python data plus the YAML position of every key and value.

PyYAML's `safe_load` forgets where things came from and silently keeps the last of two equal
keys. Here the node tree is composed with the pure-Python SafeLoader (its marks carry line and
column), checked (one document, a mapping, no duplicate keys, string keys only) and turned into
dicts, lists and scalars by hand, recording a `Where` for each path such as
`("resources", 0, "zone")`. Only the standard library and PyYAML are imported.

Nothing here raises for a bad file: `read_document` returns a `Document` whose `problems` hold
`Problem`s; `data` is None when nothing usable could be read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

PathKey = str | int
"""One step of a data path: a mapping key or a list index."""
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Pos:
    """A 1-based line and column in the file."""

    line: int = 1
    col: int = 1

    @classmethod
    def of(cls, mark: Any) -> Pos:
        """The position of a PyYAML mark (0-based) or (1, 1) when there is none."""
        if mark is None:
            return cls()
        return cls(mark.line + 1, mark.column + 1)


@dataclass(frozen=True)
class Where:
    """Where one value came from: its key (None for list items and the root) and its value."""

    key: Pos | None
    value: Pos
    at_key: bool = False  # the value is blank (`key:`) or a mapping/list: point at its key

    @property
    def best_for_value(self) -> Pos:
        """Where to point for a problem with the value: a scalar itself, else its key if any."""
        return self.key if (self.at_key and self.key is not None) else self.value


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a file: where, which field (may be empty), what, and a hint."""

    pos: Pos
    field: str
    message: str
    hint: str | None = None

    def render(self, file: str) -> str:
        """`FILE:LINE:COL: field: message (hint)` on one line."""
        text = f"{file}:{self.pos.line}:{self.pos.col}: "
        if self.field:
            text += f"{self.field}: "
        text += self.message
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(text.splitlines())


@dataclass
class Document:
    """The result of reading one file."""

    data: Any = None
    where: dict[tuple[PathKey, ...], Where] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    unreadable: set[tuple[PathKey, ...]] = field(default_factory=set)
    """Paths whose value could not be read (already a problem): later complaints about them are noise."""


def format_path(path: tuple[PathKey, ...]) -> str:
    """`("resources", 0, "zone")` -> `resources[0].zone`; odd keys are quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"{node.value!r}"


def _pos_of_index(text: str, index: int) -> Pos:
    """The 1-based line/column of a character offset in `text`."""
    index = max(0, min(index, len(text)))
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return Pos(line, col)


def read_text(path: Path) -> tuple[str | None, Problem | None]:
    """The file's text, or a Problem saying why it cannot be read."""
    try:
        if path.is_dir():
            return None, Problem(Pos(), "", "is a directory, not a recipe file", "pass the path of a .yaml file")
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, Problem(
            Pos(), "", "file not found", "check the path; recipes are YAML files such as recipes/quickstart.yaml"
        )
    except IsADirectoryError:
        return None, Problem(Pos(), "", "is a directory, not a recipe file", "pass the path of a .yaml file")
    except PermissionError:
        return None, Problem(Pos(), "", "cannot read file: permission denied", "check the file's permissions")
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        return None, Problem(Pos(), "", f"cannot read file: {reason}")
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        byte = raw[exc.start : exc.start + 1].hex()
        return None, Problem(
            Pos(line, col), "", f"file is not valid UTF-8 (byte 0x{byte})", "save the recipe as UTF-8 text"
        )


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    if isinstance(exc, yaml.reader.ReaderError):
        what = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return Problem(
            _pos_of_index(text, exc.position),
            "",
            f"invalid YAML: unacceptable character #x{ord(what):04x}",
            "remove control characters from the file",
        )
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        hint = None
        if "\t" in problem or "'\\t'" in problem:
            hint = "YAML indentation must use spaces, not tabs"
        elif exc.context and exc.context_mark is not None:
            hint = f"{exc.context} at line {exc.context_mark.line + 1}"
        return Problem(Pos.of(mark), "", f"invalid YAML: {problem}", hint)
    return Problem(Pos(), "", f"invalid YAML: {exc}")


class _Reader:
    """Turns a composed node tree into plain data, recording positions and problems."""

    def __init__(self, loader: yaml.SafeLoader, doc: Document) -> None:
        self.loader = loader
        self.doc = doc
        self.active: set[int] = set()

    def problem(self, pos: Pos, path: tuple[PathKey, ...], message: str, hint: str | None = None) -> None:
        self.doc.problems.append(Problem(pos, format_path(path), message, hint))

    def value(self, node: Node, path: tuple[PathKey, ...], key: Pos | None) -> Any:
        blank = isinstance(node, ScalarNode) and node.value == "" and node.tag == "tag:yaml.org,2002:null"
        self.doc.where[path] = Where(key, Pos.of(node.start_mark), blank or not isinstance(node, ScalarNode))
        if id(node) in self.active:
            self.problem(
                Pos.of(node.start_mark),
                path,
                "an alias refers to itself (recursive structure)",
                "recipes cannot be recursive",
            )
            self.doc.unreadable.add(path)
            return None
        if isinstance(node, MappingNode):
            self.active.add(id(node))
            try:
                return self.mapping(node, path)
            finally:
                self.active.discard(id(node))
        if isinstance(node, SequenceNode):
            self.active.add(id(node))
            try:
                return [self.value(item, (*path, i), None) for i, item in enumerate(node.value)]
            finally:
                self.active.discard(id(node))
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            reason = getattr(exc, "problem", None) or str(exc)
            self.problem(
                Pos.of(node.start_mark),
                path,
                f"cannot read value {node.value!r}: {reason}",
                "quote it to make it a string",
            )
            self.doc.unreadable.add(path)
            return None

    def mapping(self, node: MappingNode, path: tuple[PathKey, ...]) -> dict[str, Any]:
        own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merges, merged pairs first
        except yaml.YAMLError as exc:
            self.doc.problems.append(_yaml_problem(exc, ""))
        pairs = node.value
        merged_count = len(pairs) - own
        result: dict[str, Any] = {}
        first_seen: dict[str, Pos] = {}
        for index, (key_node, value_node) in enumerate(pairs):
            key_pos = Pos.of(key_node.start_mark)
            if not isinstance(key_node, ScalarNode):
                self.problem(key_pos, path, f"keys must be strings, got {_describe(key_node)}")
                continue
            try:
                key = self.loader.construct_object(key_node, deep=True)
            except (yaml.YAMLError, ValueError, TypeError, OverflowError):
                key = key_node.value
            if not isinstance(key, str):
                hint = (
                    "YAML reads yes/no/on/off/true/false as booleans; quote the key"
                    if isinstance(key, bool)
                    else "quote the key"
                )
                self.problem(
                    key_pos, path, f"keys must be strings, got {key_node.value!r} ({type(key).__name__})", hint
                )
                continue
            if index >= merged_count:  # keys written here (not merged in) must be unique
                if key in first_seen:
                    first = first_seen[key]
                    self.problem(
                        key_pos,
                        (*path, key),
                        f"duplicate key {key!r}",
                        f"first defined at line {first.line}, column {first.col}; remove one of them",
                    )
                    continue
                first_seen[key] = key_pos
            result[key] = self.value(value_node, (*path, key), key_pos)
        return result


def read_document(text: str) -> Document:
    """Compose `text` as exactly one YAML document whose root is a mapping.

    Never raises for bad input: every problem found goes into `Document.problems`.
    """
    doc = Document()
    try:
        loader = yaml.SafeLoader(text)  # checks for unprintable characters at once
    except yaml.YAMLError as exc:
        doc.problems.append(_yaml_problem(exc, text))
        return doc
    try:
        try:
            root = loader.get_node() if loader.check_node() else None
            if root is not None and loader.check_node():
                extra = loader.peek_event()
                doc.problems.append(
                    Problem(
                        Pos.of(extra.start_mark),
                        "",
                        "the file holds more than one YAML document",
                        "a recipe file is one document; remove the '---' separator or split the file",
                    )
                )
                return doc
        except yaml.YAMLError as exc:
            doc.problems.append(_yaml_problem(exc, text))
            return doc
        empty_hint = "a recipe is a mapping with at least name, resources and run; see recipes/quickstart.yaml"
        if root is None or (isinstance(root, ScalarNode) and root.tag == "tag:yaml.org,2002:null"):
            doc.problems.append(Problem(Pos(), "", "file is empty", empty_hint))
            return doc
        if not isinstance(root, MappingNode):
            what = "a list" if isinstance(root, SequenceNode) else f"the value {root.value!r}"
            doc.problems.append(
                Problem(
                    Pos.of(root.start_mark), "", f"a recipe must be a mapping of keys to values, got {what}", empty_hint
                )
            )
            return doc
        reader = _Reader(loader, doc)
        doc.data = reader.value(root, (), None)
        return doc
    finally:
        loader.dispose()
