"""The benches' one reader of bench/_bench_train.py's log lines (its docstring has the format):

    STEP <n> WORLD <w> T <time>                                   rank 0, every step
    BOOT WORLD <w> T0 <start> T1 <ready> RESUMED <step|None>      rank 0, every worker start
    RANK <r> T0 <start> TD <data loaded> T1 <ready>               every rank, every worker start

A line may carry a prefix (bench/recovery.py's baseline timestamps each line it pumps). The logs
grow while a bench runs: `Timeline.refresh()` reads only what was appended since the last call
and keeps a partial last line until it is complete.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from _shared import wait_until

T = TypeVar("T")


class Kind(str, enum.Enum):
    STEP = "STEP"
    BOOT = "BOOT"
    RANK = "RANK"


@dataclass(frozen=True, order=True)
class Line:
    """One parsed line; ordered by time first.

    STEP: `step` completed at `t` at world size `world`. BOOT: a worker start at `world`, started
    at `t0`, trainer ready at `t`, resumed from `step` (0: no checkpoint). RANK: one rank's start,
    data loaded at `t0`, trainer ready at `t` (its process group, DDP and resume).
    """

    t: float
    kind: Kind
    step: int
    world: int
    source: str  # which log: a node's name
    t0: float = 0.0


def parse(text: str, source: str) -> Line | None:
    """The Line in `text` (after any prefix), or None for any other or a malformed line."""
    for kind in Kind:
        at = text.find(kind.value + " ")
        if at >= 0:
            break
    else:
        return None
    words = text[at:].split()
    try:
        if kind is Kind.STEP:  # STEP n WORLD w T t
            return Line(float(words[5]), kind, int(words[1]), int(words[3]), source)
        if kind is Kind.BOOT:  # BOOT WORLD w T0 t0 T1 t1 RESUMED r
            resumed = 0 if words[8] == "None" else int(words[8])
            return Line(float(words[6]), kind, resumed, int(words[2]), source, t0=float(words[4]))
        return Line(float(words[7]), kind, 0, 0, source, t0=float(words[5]))  # RANK r T0 t0 TD td T1 t1
    except (IndexError, ValueError):
        return None


class Timeline:
    """The lines of every log `paths()` names ({source: path}, asked again at each refresh)."""

    def __init__(self, paths: Callable[[], dict[str, Path]]) -> None:
        self._paths = paths
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.lines: list[Line] = []

    def refresh(self) -> None:
        """Parse what was appended to each log since the last call. A log that cannot be read yet
        is skipped."""
        for source, path in self._paths().items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            data = self._partial.pop(path, b"") + data
            *complete, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for raw in complete:
                line = parse(raw.decode(errors="replace"), source)
                if line is not None:
                    self.lines.append(line)

    def of(self, kind: Kind) -> list[Line]:
        """The lines of one kind, by time."""
        return sorted(x for x in self.lines if x.kind is kind)

    def steps(self) -> list[Line]:
        return self.of(Kind.STEP)

    def first(self, after: float, world: int, kind: Kind = Kind.STEP) -> Line | None:
        """The earliest line of `kind` at `world` after time `after`."""
        found = [x for x in self.lines if x.kind is kind and x.t > after and x.world == world]
        return min(found, key=lambda x: x.t) if found else None

    def rank0_source(self) -> str | None:
        """The log of the newest step: the node that holds global rank 0 now."""
        steps = self.steps()
        return steps[-1].source if steps else None

    def _fresh(self, query: Callable[[], T]) -> Callable[[], T]:
        """`query` on the lines as they are now: refresh first."""

        def check() -> T:
            self.refresh()
            return query()

        return check

    def wait_first(self, after: float, world: int, timeout: float) -> Line | None:
        """Until the first step at `world` after `after` (None at the timeout). Blocking."""
        return wait_until(self._fresh(lambda: self.first(after, world)), timeout, 0.05)

    def wait_steps(self, world: int, count: int, timeout: float) -> bool:
        """Until `count` steps at `world` were printed after the last step at another world size."""

        def run_at_world() -> bool:
            run = 0
            for x in reversed(self.steps()):
                if x.world != world:
                    break
                run += 1
            return run >= count

        return bool(wait_until(self._fresh(run_at_world), timeout, 0.1))

    def wait_mid_interval(self, every: int, timeout: float = 15.0) -> int | None:
        """Until the newest step is half-way between two periodic checkpoints (the expected loss
        of a checkpoint-only job is every/2 steps; the phase should not decide it). Its step."""

        def newest_mid() -> Line | None:
            steps = self.steps()
            return steps[-1] if steps and every // 2 <= steps[-1].step % every <= every // 2 + 2 else None

        found = wait_until(self._fresh(newest_mid), timeout, 0.005)
        return found.step if found else None
