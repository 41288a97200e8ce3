"""Live progress on stderr: one bar per VM showing its bootstrap phase, prefixed output lines."""

from __future__ import annotations

import threading
from types import TracebackType

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spotrun.client import console
from spotrun.controller.bootstrap import PHASES


class BootstrapProgress:
    """A thread-safe `bootstrap.Reporter` drawing rich progress bars (plain lines off a terminal)."""

    def __init__(self, vms: list[str]) -> None:
        self._lock = threading.Lock()
        self._progress = Progress(
            TextColumn("{task.fields[vm]:<14}"),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[phase]:<8}"),
            TimeElapsedColumn(),
            console=console.err,
            transient=False,
        )
        self._tasks = {vm: self._progress.add_task("", total=len(PHASES) - 1, vm=vm, phase="queued") for vm in vms}
        self.failures: dict[str, str] = {}

    def __enter__(self) -> BootstrapProgress:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def phase(self, vm: str, phase: str) -> None:
        with self._lock:
            self._progress.update(self._tasks[vm], completed=PHASES.index(phase), phase=phase)

    def line(self, vm: str, text: str) -> None:
        with self._lock:
            self._progress.console.print(f"[{vm}] {text}", markup=False, highlight=False)

    def failed(self, vm: str, error: str) -> None:
        with self._lock:
            self.failures[vm] = error
            self._progress.update(self._tasks[vm], phase="FAILED")
            self._progress.console.print(f"[{vm}] failed: {error}", markup=False, highlight=False)
