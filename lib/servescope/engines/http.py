"""The two HTTP calls adapters make to a server: POST JSON, GET JSON."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def post(url: str, body: dict[str, Any] | None = None, timeout_s: float = 60.0) -> int:
    """POST JSON (or nothing); the HTTP status, raising on transport errors and 4xx/5xx."""
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """GET a URL and decode JSON (raises on HTTP errors)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())
