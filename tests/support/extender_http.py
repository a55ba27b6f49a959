"""Talk to a running extender server as kube-scheduler does, for the tests that start one."""

from __future__ import annotations

import http.client
import json
from typing import Any

from defrag.extender.server import ExtenderHTTPServer


def post_ok(srv: ExtenderHTTPServer, verb: str, body: dict[str, Any]) -> Any:
    """POST ``body`` as JSON to ``/<verb>``; the answer, which must be a 200."""
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
    conn.request("POST", f"/{verb}", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return json.loads(resp.read())
