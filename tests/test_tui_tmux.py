"""End to end: the real TUI process in a real terminal (tmux), read back with capture-pane."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid

import pytest
from polling import wait_until
from test_tui import populate

pytestmark = pytest.mark.slow


def capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def wait_screen(session: str, condition, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = capture(session)
        if condition(screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"screen never matched; last screen:\n{screen}")
        time.sleep(0.1)


def _session_ended(session: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0


def table_part(screen: str) -> str:
    """The lines between the panels and the events box."""
    return screen.split("node", 1)[1].split("events", 1)[0]


def test_tui_in_tmux(etcd_server, store, cluster, tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    populate(store, cluster, time.time())
    session = f"spotrun-tui-{uuid.uuid4().hex[:8]}"
    command = (
        f"{sys.executable} -m spotrun.tui.app {cluster} --endpoint {etcd_server.endpoint}"  # Textual draws on stderr
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command],
        check=True,
        env={"TERM": "xterm-256color", "PATH": "/usr/bin:/bin"},
    )
    try:
        screen = wait_screen(session, lambda s: "vm-3" in s and "target 4" in s)
        assert "notice 4" in screen and "1,203/5,000" in screen
        # A fast burst, as a user types it: the "/" binding must move focus before the text arrives.
        subprocess.run(["tmux", "send-keys", "-t", session, "/", "lo-b", "Enter"], check=True)
        screen = wait_screen(session, lambda s: "vm-0" not in table_part(s))
        assert "vm-1" in table_part(screen) and "vm-3" in table_part(screen)
        assert "vm-2" not in table_part(screen)
        store.put_node(__import__("test_tui").node(cluster, 5, time.time(), zone="lo-b"))
        wait_screen(session, lambda s: "vm-5" in table_part(s))
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        assert wait_until(lambda: _session_ended(session), 10, 0.1), "the TUI did not quit on q"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
