"""Emulated instance metadata endpoint of a local VM, speaking the real clouds' notice protocols.

One HTTP server on 127.0.0.1 answers all three dialects, so `spotrun.node.notices` runs unchanged
against it and against a cloud:

- AWS IMDSv2: `PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action` with the
  token (401 without one, 404 until a notice, then `{"action": "terminate", "time": ...}`).
- GCP: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` (403 otherwise),
  `FALSE`/`TRUE`, `?wait_for_change=true&last_etag=..&timeout_sec=..` long-polls.
- Azure Scheduled Events: `GET /metadata/scheduledevents?api-version=..` with `Metadata: true`
  (400 otherwise); `POST` the same path with `{"StartRequests": [{"EventId": ..}]}` to acknowledge.

The notice itself lives in `<vm_dir>/notice.json`, written by `arm_notice` from any process
(`LocalProvider.preempt`), and is re-read on every request.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import secrets
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NOTICE_FILE = "notice.json"
AWS_TOKEN_MAX_TTL = 21600
GCP_DEFAULT_WAIT_S = 300.0  # how long a wait_for_change request blocks without timeout_sec
_POLL_S = 0.05  # how often a blocked GCP long-poll re-reads the notice file


@dataclass(frozen=True)
class ArmedNotice:
    """A preemption notice given to a VM: when it was given and when the VM dies (epoch s)."""

    notice_at: float
    deadline: float
    event_id: str


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON so that readers in other processes see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None if the file is missing or not (yet) valid."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def arm_notice(vm_dir: Path, notice_seconds: float, now: float | None = None) -> ArmedNotice:
    """Give the VM in `vm_dir` a preemption notice ending `notice_seconds` from now.

    Idempotent in effect: an existing notice with an earlier deadline is kept (a VM is
    preempted once). Returns the notice in force.
    """
    now = time.time() if now is None else now
    current = read_notice(vm_dir)
    if current is not None and current.deadline <= now + notice_seconds:
        return current
    notice = ArmedNotice(notice_at=now, deadline=now + max(0.0, notice_seconds), event_id=str(uuid.uuid4()).upper())
    write_json_atomic(vm_dir / NOTICE_FILE, asdict(notice))
    return notice


def read_notice(vm_dir: Path) -> ArmedNotice | None:
    """The notice armed for the VM in `vm_dir`, or None."""
    data = read_json(vm_dir / NOTICE_FILE)
    if data is None:
        return None
    try:
        return ArmedNotice(float(data["notice_at"]), float(data["deadline"]), str(data["event_id"]))
    except (KeyError, TypeError, ValueError):
        return None


def iso_utc(epoch: float) -> str:
    """AWS's time format: `2026-11-30T12:00:00Z` (whole seconds, rounded down)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))


def rfc1123(epoch: float) -> str:
    """Azure's time format: `Mon, 30 Nov 2026 12:00:00 GMT` (whole seconds, rounded down)."""
    return email.utils.formatdate(int(epoch), usegmt=True)


def gcp_etag(value: str) -> str:
    """GCP-style ETag of a metadata value: 16 hex digits that change when the value does."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class _State:
    """What the handlers share: the VM's identity, its notice file, AWS tokens, Azure acks."""

    def __init__(self, vm_dir: Path, identity: Mapping[str, str]) -> None:
        self.vm_dir = vm_dir
        self.identity = dict(identity)
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.acked: set[str] = set()  # Azure EventIds acknowledged with StartRequests
        self.lock = threading.Lock()

    def notice(self) -> ArmedNotice | None:
        return read_notice(self.vm_dir)

    def new_token(self, ttl: int) -> str:
        token = secrets.token_urlsafe(32)
        with self.lock:
            now = time.monotonic()
            self.tokens = {t: exp for t, exp in self.tokens.items() if exp > now}
            self.tokens[token] = now + ttl
        return token

    def token_valid(self, token: str | None) -> bool:
        with self.lock:
            return token is not None and self.tokens.get(token, 0.0) > time.monotonic()

    def gcp_preempted(self) -> str:
        return "TRUE" if self.notice() is not None else "FALSE"

    def azure_document(self) -> dict[str, Any]:
        notice = self.notice()
        if notice is None:
            return {"DocumentIncarnation": 1, "Events": []}
        started = notice.event_id in self.acked
        event = {
            "EventId": notice.event_id,
            "EventStatus": "Started" if started else "Scheduled",
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": [self.identity.get("name", self.identity["id"])],
            "NotBefore": rfc1123(notice.deadline),
            "Description": "Virtual machine is being preempted.",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        return {"DocumentIncarnation": 3 if started else 2, "Events": [event]}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "spotrun-metadata"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the agent polls every second or two and the VM log would fill up."""

    # -- plumbing -----------------------------------------------------------------------------
    def _send(self, status: int, body: str | dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        if isinstance(body, dict):
            payload, content_type = json.dumps(body).encode(), "application/json"
        else:
            payload, content_type = body.encode(), "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _split(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        return parts.path.rstrip("/") or "/", {k: v[-1] for k, v in parse_qs(parts.query).items()}

    @property
    def _state(self) -> _State:
        return self.server.state

    # -- verbs --------------------------------------------------------------------------------
    def do_PUT(self) -> None:
        path, _ = self._split()
        if path != "/latest/api/token":
            return self._send(404, "Not Found")
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= AWS_TOKEN_MAX_TTL:
            return self._send(400, "Bad Request")
        token = self._state.new_token(ttl)
        self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})

    def do_GET(self) -> None:
        path, query = self._split()
        if path.startswith("/latest/"):
            return self._aws(path)
        if path.startswith("/computeMetadata/v1/"):
            return self._gcp(path, query)
        if path.startswith("/metadata/"):
            return self._azure_get(path, query)
        self._send(404, "Not Found")

    def do_POST(self) -> None:
        path, query = self._split()
        if path != "/metadata/scheduledevents":
            return self._send(404, "Not Found")
        if error := self._azure_error(query):
            return self._send(400, {"error": error})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            requests = json.loads(self.rfile.read(length) or b"{}").get("StartRequests", [])
            ids = {str(r["EventId"]) for r in requests}
        except (ValueError, AttributeError, KeyError, TypeError):
            return self._send(400, {"error": "Bad request. StartRequests must list EventIds."})
        notice = self._state.notice()
        if notice is None or ids != {notice.event_id}:
            return self._send(400, {"error": "Bad request. Unknown EventId."})
        self._state.acked.add(notice.event_id)
        self._send(200, "")

    # -- AWS IMDSv2 ---------------------------------------------------------------------------
    def _aws(self, path: str) -> None:
        if not self._state.token_valid(self.headers.get("X-aws-ec2-metadata-token")):
            return self._send(401, "Unauthorized")
        ident, notice = self._state.identity, self._state.notice()
        simple = {
            "/latest/meta-data/instance-id": ident["id"],
            "/latest/meta-data/instance-type": ident.get("instance_type", ""),
            "/latest/meta-data/placement/availability-zone": ident.get("zone", ""),
        }
        if path in simple:
            return self._send(200, simple[path])
        if path in ("/latest/meta-data/spot/instance-action", "/latest/meta-data/spot/termination-time"):
            if notice is None:
                return self._send(404, "Not Found")
            if path.endswith("termination-time"):
                return self._send(200, iso_utc(notice.deadline))
            return self._send(200, {"action": "terminate", "time": iso_utc(notice.deadline)})
        self._send(404, "Not Found")

    # -- GCP ----------------------------------------------------------------------------------
    def _gcp(self, path: str, query: dict[str, str]) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        ident = self._state.identity
        simple = {
            "/computeMetadata/v1/instance/id": ident["id"],
            "/computeMetadata/v1/instance/name": ident.get("name", ident["id"]),
            "/computeMetadata/v1/instance/zone": f"projects/0/zones/{ident.get('zone', '')}",
            "/computeMetadata/v1/instance/machine-type": f"projects/0/machineTypes/{ident.get('instance_type', '')}",
        }
        if path in simple:
            return self._send(200, simple[path], {"Metadata-Flavor": "Google"})
        if path != "/computeMetadata/v1/instance/preempted":
            return self._send(404, "Not Found")
        value = self._state.gcp_preempted()
        if query.get("wait_for_change", "").lower() == "true":
            value = self._gcp_wait(value, query)
        self._send(200, value, {"Metadata-Flavor": "Google", "ETag": gcp_etag(value)})

    def _gcp_wait(self, value: str, query: dict[str, str]) -> str:
        """Block until the value's ETag differs from `last_etag` (default: the current one)."""
        last = query.get("last_etag") or gcp_etag(value)
        try:
            timeout = float(query.get("timeout_sec", GCP_DEFAULT_WAIT_S))
        except ValueError:
            timeout = GCP_DEFAULT_WAIT_S
        end = time.monotonic() + timeout
        while gcp_etag(value) == last and time.monotonic() < end:
            time.sleep(_POLL_S)
            value = self._state.gcp_preempted()
        return value

    # -- Azure --------------------------------------------------------------------------------
    def _azure_error(self, query: dict[str, str]) -> str | None:
        if self.headers.get("Metadata", "").lower() != "true":
            return "Bad request. Required metadata header not specified"
        if "api-version" not in query:
            return "Bad request. api-version was not specified in the request"
        return None

    def _azure_get(self, path: str, query: dict[str, str]) -> None:
        if error := self._azure_error(query):
            return self._send(400, {"error": error})
        if path == "/metadata/scheduledevents":
            return self._send(200, self._state.azure_document())
        if path == "/metadata/instance/compute/name":
            name = self._state.identity.get("name", self._state.identity["id"])
            return self._send(200, name if query.get("format") == "text" else {"name": name})
        self._send(404, {"error": "Not found"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a GCP long-poll must not keep the VM init alive
    state: _State


class MetadataServer:
    """The metadata endpoint of one VM on 127.0.0.1; `start()` serves from a daemon thread."""

    def __init__(self, vm_dir: Path, identity: Mapping[str, str], host: str = "127.0.0.1", port: int = 0) -> None:
        """`identity` needs "id"; "name", "zone" and "instance_type" are optional. Binds now;
        raises OSError if the port is taken."""
        self._httpd = _Server((host, port), _Handler)
        self._httpd.state = _State(vm_dir, identity)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serve in a daemon thread; returns at once."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metadata", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port; blocks until the serving loop has stopped."""
        if self._thread is not None:
            self._httpd.shutdown()
        self._httpd.server_close()
