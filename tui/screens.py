"""Secondary screens: cluster picker, confirmation, target size, help, log follower."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Label, Log, OptionList, Static
from textual.worker import get_current_worker

from spotrun.client import api
from spotrun.errors import ControlPlaneError, SpotrunError


class PickerScreen(Screen[str]):
    """Lists the clusters in etcd; dismisses with the chosen name. Retries while etcd is away."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "app.quit", "Quit"), Binding("f5", "reload", "Reload")]

    class Listed(Message):
        def __init__(self, names: list[str] | None, error: str) -> None:
            super().__init__()
            self.names, self.error = names, error

    def __init__(self, list_clusters: Callable[[], list[str]]) -> None:
        super().__init__()
        self._list = list_clusters

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Label("Pick a cluster", id="picker-title")
            yield Static("connecting to etcd…", id="picker-status")
            yield OptionList(id="clusters")
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        self._load()

    @work(thread=True, exclusive=True)
    def _load(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                self.post_message(self.Listed(self._list(), ""))
                return
            except ControlPlaneError as exc:
                self.post_message(self.Listed(None, f"disconnected, retrying: {exc.message}"))
            worker_sleep(worker, 1.0)

    def on_picker_screen_listed(self, message: Listed) -> None:
        status = self.query_one("#picker-status", Static)
        status.set_class(bool(message.error), "-error")
        if message.names is None:
            status.update(message.error)
            return
        options = self.query_one("#clusters", OptionList)
        options.clear_options()
        options.add_options(message.names)
        status.update(
            f"{len(message.names)} clusters in etcd"
            if message.names
            else "no cluster in etcd yet: start one with `spotrun up RECIPE` (F5 reloads)"
        )
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(str(event.option.prompt))


def worker_sleep(worker, seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while not worker.is_cancelled and time.monotonic() < end:
        time.sleep(0.05)


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no for a destructive action; `y`/Enter confirm, `n`/Escape cancel."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ScaleScreen(ModalScreen[int | None]):
    """Asks for the new target size; Enter applies, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: int | None, limits: tuple[int, int] | None) -> None:
        super().__init__()
        self.current, self.limits = current, limits

    def compose(self) -> ComposeResult:
        span = f" ({self.limits[0]}-{self.limits[1]})" if self.limits else ""
        with Vertical(classes="dialog"):
            yield Label(
                f"New target size{span}, now {self.current if self.current is not None else 'unset'}:",
                classes="question",
            )
            yield Input(str(self.current or ""), type="integer", id="target")
            yield Static("", id="scale-error")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            value = int(event.value)
        except ValueError:
            self.query_one("#scale-error", Static).update(f"{event.value!r} is not a whole number")
            return
        if self.limits and not self.limits[0] <= value <= self.limits[1]:
            self.query_one("#scale-error", Static).update(
                f"{value} is outside nodes.min..nodes.max ({self.limits[0]}-{self.limits[1]})"
            )
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
[b]Keys[/b]
  ↑ ↓ PgUp PgDn  select a worker (or click it)
  /              filter workers (Enter keeps it, Escape clears it)
  o / r          sort by the next column / reverse (or click a header)
  s              set the target size (same as `spotrun scale`)
  d              drain the selected node (asks first)
  p              preempt the selected node with a notice; local provider only (asks first)
  l              follow the selected node's agent log
  ?              this help
  q              quit

[b]Colours[/b]  [green]running[/]  [cyan]booting[/]  [yellow]notice (countdown)[/]  [magenta]leaving[/]  [dim]gone[/]
A [yellow]yellow[/] checkpoint is older than the recipe's checkpoint interval.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Static(HELP)


class LogScreen(Screen[None]):
    """Follows one node's training log (through `spotrun.client.api.follow_log`) until closed."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,l", "close", "Close")]

    class _Stop(Exception):
        pass

    def __init__(self, cluster: str, node: str) -> None:
        super().__init__()
        self.cluster, self.node = cluster, node

    def compose(self) -> ComposeResult:
        yield Label(f" log of {self.node} (Escape closes)", id="log-title")
        yield Log(id="log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self._follow()

    @work(thread=True, exclusive=True)
    def _follow(self) -> None:
        worker = get_current_worker()
        log = self.query_one(Log)

        def emit(node: str, text: str) -> None:
            if worker.is_cancelled:
                raise self._Stop()  # ends the SSH read at the next line
            self.app.call_from_thread(log.write_line, text)  # blocks: no queue builds up

        def follow() -> None:
            try:
                api.follow_log(self.cluster, self.node, emit)
            except (self._Stop, RuntimeError):  # RuntimeError: the app has already exited
                return
            except SpotrunError as exc:
                if not worker.is_cancelled:
                    self.app.call_from_thread(log.write_line, f"error: {exc}")

        # `logs` blocks while the log is quiet; a daemon thread lets this worker (and the app) end at once.
        reader = threading.Thread(target=follow, name=f"spotrun-tui-log {self.node}", daemon=True)
        reader.start()
        while reader.is_alive() and not worker.is_cancelled:
            reader.join(0.2)

    def action_close(self) -> None:
        self.workers.cancel_all()
        self.dismiss(None)
