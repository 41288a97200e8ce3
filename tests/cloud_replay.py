"""A tiny HTTP server on 127.0.0.1 that answers a cloud API's requests with recorded JSON.

Used by the GCP and Azure provider tests, where no local server of the real API exists (unlike
moto for AWS). Each test registers routes `(method, path regex) -> handler(request)`; a handler
returns `(status, json body)` built from the recorded responses in tests/data/ (and whatever
state the test keeps, so an inserted VM shows up in the next list). Every request is recorded
with its method, path, query, headers and decoded JSON body, so a test asserts on the exact
bytes the provider sent through libcloud. An unmatched request answers 501 and is recorded too,
so a test can assert `server.unmatched == []`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    raw: bytes
    match: re.Match[str] | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None

    @property
    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.raw.decode()).items()}


Handler = Callable[[Request], tuple[int, Any]]


@dataclass
class ReplayServer:
    routes: list[tuple[str, re.Pattern[str], Handler]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    unmatched: list[Request] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Answer `method` requests whose path fully matches `pattern`; later routes win."""
        self.routes.insert(0, (method, re.compile(pattern), handler))

    def sent(self, method: str, pattern: str) -> list[Request]:
        """The recorded requests of `method` whose path matches `pattern`, in order."""
        regex = re.compile(pattern)
        return [r for r in self.requests if r.method == method and regex.fullmatch(r.path)]

    def _answer(self, request: Request) -> tuple[int, Any]:
        with self.lock:
            self.requests.append(request)
            for method, pattern, handler in self.routes:
                match = pattern.fullmatch(request.path)
                if method == request.method and match:
                    request.match = match
                    return handler(request)
            self.unmatched.append(request)
        return 501, {"error": {"code": "NotReplayed", "message": f"{request.method} {request.path}"}}


@contextmanager
def replay_server() -> Iterator[ReplayServer]:
    """Start a ReplayServer on a free loopback port; stopped on exit."""
    state = ReplayServer()

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(
                self.command,
                parts.path,
                {k: v[0] for k, v in parse_qs(parts.query).items()},
                {k.lower(): v for k, v in self.headers.items()},
                raw,
            )
            status, body = state._answer(request)
            payload = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="replay-server", daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
