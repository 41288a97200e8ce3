"""libcloud's EC2 driver, fixed for spotrun: SigV4 always, namespace-tolerant XML, real error codes.

apache-libcloud 3.9.1 has four problems against moto's EC2 server (and two of them against any
EC2-compatible endpoint); this subclass fixes all four and changes nothing on real AWS:

- us-east-1 is signed with SigV2, which moto routes to S3: we always sign with SigV4.
- libcloud looks elements up in `http://ec2.amazonaws.com/doc/<version>/`; moto omits the
  trailing slash, so every lookup came back empty: the response body is normalised.
- an error body with a namespace parsed to an empty message: errors become `Ec2ApiError` with
  the EC2 error code, so callers can map capacity and credential errors.
- `ex_create_tags` sent 0-based `Tag.N` indices that moto rejects: ours are 1-based.

`query(action, params)` is the raw Query-API call spotrun uses where libcloud has no method
(DescribeSpotPriceHistory, tag specifications on key pairs and security groups); it returns the
response root with namespaces stripped. A driver holds one HTTP connection: use one per thread.
Only providers/aws.py imports this module, inside functions (libcloud loads lazily).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlsplit

from libcloud.compute.drivers.ec2 import API_VERSION, EC2Connection, EC2NodeDriver, EC2Response

_UNSLASHED_NS = re.compile(rb'xmlns="(http://ec2\.amazonaws\.com/doc/\d{4}-\d{2}-\d{2})"')


class Ec2ApiError(Exception):
    """An EC2 API error response: `code` is EC2's error code (e.g. InsufficientInstanceCapacity)."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


def strip_namespaces(root: ET.Element) -> ET.Element:
    """Drop `{namespace}` from every tag in place, so plain paths like `instancesSet/item` work."""
    for element in root.iter():
        if isinstance(element.tag, str) and "}" in element.tag:
            element.tag = element.tag.split("}", 1)[1]
    return root


def _as_bytes(body: Any) -> bytes:
    return body if isinstance(body, bytes) else str(body or "").encode("utf-8")


class SpotrunEC2Response(EC2Response):
    """EC2Response with the namespace normalised and errors raised as Ec2ApiError."""

    def parse_body(self) -> Any:
        # Real EC2 answers with a trailing slash already; this only adds it where it is missing.
        self.body = _UNSLASHED_NS.sub(rb'xmlns="\1/"', _as_bytes(self.body)).decode("utf-8")
        return super().parse_body()

    def parse_error(self) -> str:
        try:
            root = strip_namespaces(ET.fromstring(_as_bytes(self.body)))
        except ET.ParseError:
            raise Ec2ApiError("MalformedResponse", f"HTTP {self.status}: {str(self.body)[:200]}", self.status) from None
        error = root.find(".//Errors/Error")
        if error is None:
            error = root.find(".//Error")
        if error is None:
            raise Ec2ApiError("UnknownError", f"HTTP {self.status}: {str(self.body)[:200]}", self.status)
        raise Ec2ApiError(error.findtext("Code") or "UnknownError", error.findtext("Message") or "", self.status)


class SpotrunEC2Connection(EC2Connection):
    responseCls = SpotrunEC2Response


class SpotrunEC2Driver(EC2NodeDriver):
    """EC2NodeDriver with the fixes in the module docstring; `endpoint_url` overrides the host."""

    connectionCls = SpotrunEC2Connection

    def __init__(
        self,
        key: str,
        secret: str,
        *,
        region: str,
        token: str | None = None,
        endpoint_url: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        host = port = None
        secure = True
        if endpoint_url:
            parts = urlsplit(endpoint_url)
            host, port, secure = parts.hostname, parts.port, parts.scheme != "http"
        super().__init__(
            key,
            secret,
            secure=secure,
            host=host,
            port=port,
            region=region,
            token=token,
            signature_version="4",
            timeout=timeout,
        )

    def query(self, action: str, params: dict[str, str] | None = None) -> ET.Element:
        """One Query-API call; returns the response root without namespaces. Blocking.

        Raises Ec2ApiError for an error response (libcloud's own exceptions for transport errors).
        """
        response = self.connection.request(self.path, params={"Action": action, **(params or {})})
        return strip_namespaces(ET.fromstring(_as_bytes(response.body)))

    def ex_create_tags(self, resource: Any, tags: dict[str, str]) -> bool:
        """CreateTags with 1-based indices (libcloud sends 0-based ones, which EC2 APIs may reject)."""
        if not tags:
            return True
        params = {"ResourceId.1": resource.id}
        for i, (key, value) in enumerate(tags.items(), start=1):
            params[f"Tag.{i}.Key"], params[f"Tag.{i}.Value"] = key, value
        root = self.query("CreateTags", params)
        return (root.findtext("return") or "true") == "true"


__all__ = ["API_VERSION", "Ec2ApiError", "SpotrunEC2Driver", "strip_namespaces"]
