"""The two HTTP calls adapters make to a server: POST JSON, GET JSON."""

from __future__ import annotations

import json
import time
import urllib.error
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


def get_json_patiently(url: str, timeouts_s: float | tuple[float, ...] = 10.0, pause_s: float = 1.0) -> Any:
    """GET JSON, asking again with a longer timeout (one number: it, then 3x and 6x it) when the server was too
    slow to answer or dropped the connection; an HTTP error answer is final (the server spoke: asking again changes
    nothing)."""
    tries = (timeouts_s, 3 * timeouts_s, 6 * timeouts_s) if isinstance(timeouts_s, (int, float)) else timeouts_s
    *first, last = tries
    for timeout_s in first:
        try:
            return get_json(url, timeout_s)
        except urllib.error.HTTPError:
            raise
        except OSError:
            # a just-ready server on an oversubscribed host (replicas still starting beside it) can miss a 10 s
            # timeout: that is a slow answer, not a missing endpoint
            time.sleep(pause_s)
    return get_json(url, last)
