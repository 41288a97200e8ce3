"""Widgets of the main screen. They draw what `spotrun.tui.model` computed and hold no logic.

`WorkersTable` is built on Textual's Line API: it renders only the visible lines, caches every
rendered line by its content, and after an update repaints only the lines whose content changed
(Textual's DataTable repaints every visible cell on any change: 62-89 % of a core at 500 rows).
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from spotrun.tui.model import COLUMNS, Snapshot, WorkerRow, arrange, fmt_bytes, fmt_count
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from spotrun.fmt import duration

# Minimum widths of the columns; spare width goes to the first two.
_WIDTHS = (12, 13, 10, 12, 7, 7, 7)
_RIGHT = {4, 5, 6}
_TONES = ("running", "standby", "booting", "notice", "leaving", "gone")


class WorkersTable(ScrollView, can_focus=True):
    """The worker rows, sortable (`o`, `r`, or a click on a header) and filterable (the app's `/`)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"workers--header", "workers--cursor", *(f"workers--{t}" for t in _TONES)}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "cursor(-10)", show=False),
        Binding("pagedown", "cursor(10)", show=False),
        Binding("o", "sort_next", "Sort"),
        Binding("r", "sort_reverse", "Reverse", show=False),
    ]

    sort_column: reactive[int] = reactive(0)
    sort_reverse: reactive[bool] = reactive(False)
    filter_text: reactive[str] = reactive("")  # not `query`: that is DOMNode.query()

    class Selected(Message):
        def __init__(self, row: WorkerRow | None) -> None:
            super().__init__()
            self.row = row

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._all: tuple[WorkerRow, ...] = ()
        self.rows: list[WorkerRow] = []
        self.selected_id: str | None = None
        self._cursor = 0
        self._lines: LRUCache[tuple, Strip] = LRUCache(4096)
        self._shown: dict[int, tuple] = {}  # screen line -> cache key of what it shows
        self._styles: dict[str, Style] = {}
        self._widths: tuple[int, ...] = _WIDTHS

    # --- data in ---------------------------------------------------------------------------

    def update_rows(self, rows: tuple[WorkerRow, ...]) -> None:
        """Take new rows; repaint only the visible lines whose content changed."""
        self._all = rows
        self._arrange()

    def _arrange(self) -> None:
        self.rows = arrange(self._all, self.sort_column, self.sort_reverse, self.filter_text)
        ids = [r.id for r in self.rows]
        self._cursor = (
            ids.index(self.selected_id) if self.selected_id in ids else min(self._cursor, max(0, len(ids) - 1))
        )
        if self.rows:
            self._select(self.rows[self._cursor].id)
        else:
            self._select(None)
        height = len(self.rows) + 1
        if self.virtual_size.height != height:
            self.virtual_size = Size(self.size.width, height)
        self._repaint_changed()

    def _select(self, node: str | None) -> None:
        if node != self.selected_id:
            self.selected_id = node
            self.post_message(self.Selected(self.selected_row))

    @property
    def selected_row(self) -> WorkerRow | None:
        return self.rows[self._cursor] if self.rows and self.selected_id is not None else None

    def watch_sort_column(self) -> None:
        self._arrange()

    def watch_sort_reverse(self) -> None:
        self._arrange()

    def watch_filter_text(self) -> None:
        self._arrange()

    # --- actions ---------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        if not self.rows:
            return
        self._cursor = max(0, min(len(self.rows) - 1, self._cursor + delta))
        self._select(self.rows[self._cursor].id)
        self._scroll_to_cursor()
        self._repaint_changed()

    def action_sort_next(self) -> None:
        self.sort_column = (self.sort_column + 1) % len(COLUMNS)

    def action_sort_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def _scroll_to_cursor(self) -> None:
        top, body = int(self.scroll_offset.y), max(1, self.size.height - 1)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False)
        elif self._cursor >= top + body:
            self.scroll_to(y=self._cursor - body + 1, animate=False)

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            column = self._column_at(event.x)
            if column == self.sort_column:
                self.sort_reverse = not self.sort_reverse
            else:
                self.sort_column = column
            return
        index = int(self.scroll_offset.y) + event.y - 1
        if 0 <= index < len(self.rows):
            self._cursor = index
            self._select(self.rows[index].id)
            self._repaint_changed()

    def _column_at(self, x: int) -> int:
        edge = 0
        for i, w in enumerate(self._widths):
            edge += w + 1
            if x < edge:
                return i
        return len(self._widths) - 1

    # --- rendering -------------------------------------------------------------------------

    def on_resize(self) -> None:
        spare = max(0, self.size.width - sum(_WIDTHS) - len(_WIDTHS))
        self._widths = (_WIDTHS[0] + spare // 2, _WIDTHS[1] + spare - spare // 2, *_WIDTHS[2:])
        self.virtual_size = Size(self.size.width, len(self.rows) + 1)
        self._shown.clear()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._lines.clear()
        self._shown.clear()

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(name, partial=True)
        return style

    def _key(self, y: int) -> tuple:
        """What screen line `y` shows; equal keys render equal lines."""
        if y == 0:
            return ("header", self.sort_column, self.sort_reverse, self._widths, self.size.width)
        index = int(self.scroll_offset.y) + y - 1
        if index >= len(self.rows):
            return ("blank", self.size.width)
        row = self.rows[index]
        return (
            "row",
            row.cells(),
            row.tone,
            index == self._cursor and self.has_focus,
            index == self._cursor,
            self._widths,
            self.size.width,
        )

    def _repaint_changed(self) -> None:
        """Refresh the screen lines whose key differs from what they show now."""
        scroll = int(self.scroll_offset.y)
        for y in range(self.size.height):
            key = self._key(y)
            if self._shown.get(y) != key:
                self.refresh_line(scroll + y)

    def render_line(self, y: int) -> Strip:
        key = self._key(y)
        self._shown[y] = key
        strip = self._lines.get(key)
        if strip is None:
            strip = self._lines[key] = self._render_key(key)
        return strip

    def _render_key(self, key: tuple) -> Strip:
        width = self.size.width
        if key[0] == "blank":
            return Strip.blank(width, self.rich_style)
        if key[0] == "header":
            titles = []
            for i, (title, _) in enumerate(COLUMNS):
                mark = ("▼" if self.sort_reverse else "▲") if i == self.sort_column else ""
                titles.append(title + mark)
            return self._strip(titles, self._style("workers--header"), width)
        _, cells, tone, focused, cursor, _, _ = key
        style = self._style(f"workers--{tone}")
        if cursor:
            style = style + self._style("workers--cursor") if focused else style + Style(reverse=True, dim=False)
        return self._strip(cells, style, width)

    def _strip(self, cells, style: Style, width: int) -> Strip:
        parts = []
        for i, (cell, w) in enumerate(zip(cells, self._widths, strict=False)):
            text = cell if len(cell) <= w else cell[: w - 1] + "…"
            parts.append(text.rjust(w) if i in _RIGHT else text.ljust(w))
        line = " ".join(parts)
        line = line[:width].ljust(width)
        return Strip([Segment(line, self.rich_style + style)], width)

    def on_focus(self) -> None:
        self._repaint_changed()

    def on_blur(self) -> None:
        self._repaint_changed()


class Panel(Static):
    """A fixed-height text panel that repaints only when its text changes (and never re-lays out)."""

    def __init__(self, title: str = "", **kwargs) -> None:
        super().__init__("", **kwargs)
        if title:
            self.border_title = title
        self._last: Text | None = None

    def show(self, text: Text) -> None:
        if self._last is None or text.plain != self._last.plain or text.spans != self._last.spans:
            self._last = text
            self.update(text, layout=False)  # the CSS gives every Panel a fixed height


def training_text(snap: Snapshot) -> Text:
    t = snap.training
    text = Text()
    text.append("step ", "dim").append("-" if t.step is None else f"{t.step:,}")
    if t.total_steps:
        text.append(f"/{t.total_steps:,}", "dim")
    text.append("\nworld ", "dim").append("-" if t.world_size is None else str(t.world_size))
    text.append("  loss ", "dim").append("-" if t.loss is None else f"{t.loss:.4g}")
    text.append("\n").append(fmt_count(t.samples_per_s)).append(" smp/s", "dim")
    text.append("  ETA ", "dim").append(duration(t.eta_s))
    return text


def costs_text(snap: Snapshot) -> Text:
    c = snap.costs
    s = c.summary
    text = Text()
    text.append("burn ", "dim").append(f"${s.burn_per_hour:.2f}/h")
    if c.max_per_hour:
        text.append(f" of ${c.max_per_hour:.2f}", "dim")
    text.append("\ntotal ", "dim").append(f"${s.total:.2f}")
    if c.max_total:
        text.append(f" of ${c.max_total:.0f}", "dim")
    text.append("\nsaved ", "dim").append(f"{s.savings_pct:.1f} %", "bold green" if s.savings_pct > 0 else "")
    used = c.budget_used
    text.append("\n")
    if used is None:
        text.append("no budget cap", "dim")
    else:
        bar = 8
        full = min(bar, round(used * bar))
        colour = "green" if used < 0.75 else ("yellow" if used < 0.9 else "bold red")
        text.append("budget ", "dim").append("█" * full, colour).append("░" * (bar - full), "dim")
        text.append(f" {used * 100:.0f}%", colour)
    return text


def checkpoint_text(snap: Snapshot) -> Text:
    c = snap.checkpoints
    text = Text()
    if c.latest is None:
        return text.append("no checkpoint yet", "dim")
    warn = "bold yellow" if c.stale else ""
    text.append("step ", "dim").append(f"{c.latest.step:,}", warn).append(f" ({c.count} kept)", "dim")
    text.append("\nage ", "dim").append(duration(c.age_s), warn)
    if c.stale:
        text.append(" overdue", warn)
    text.append("\n").append(fmt_bytes(c.latest.bytes)).append("  ")
    text.append("sha256 ✓" if c.verified else "no checksum", "green" if c.verified else "yellow")
    return text


def title_text(snap: Snapshot | None, cluster: str) -> Text:
    text = Text()
    text.append(" spotrun ", "bold reverse").append(f" {cluster} ", "bold")
    if snap is not None:
        target = "-" if snap.target is None else str(snap.target)
        text.append(f" {snap.alive} alive / {len(snap.rows)} nodes / target {target}", "")
    return text
