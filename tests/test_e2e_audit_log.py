"""The e2e harness reads the API server's audit log while the server writes it: a line being
written as it is read (no newline yet) is not an event yet, and the next read has it whole."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.controlplane import ControlPlane


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    plane = object.__new__(ControlPlane)  # only the folder matters to the audit log
    plane.folder = tmp_path
    events = [{"auditID": str(i), "verb": "create"} for i in range(3)]
    whole = "".join(json.dumps(e) + "\n" for e in events[:2])
    plane.audit_log.write_text(whole + json.dumps(events[2])[:20])  # torn mid-string
    assert plane.audit_events() == events[:2]
    plane.audit_log.write_text(whole + json.dumps(events[2]) + "\n")
    assert plane.audit_events() == events


def test_no_log_yet_is_no_events(tmp_path: Path) -> None:
    plane = object.__new__(ControlPlane)
    plane.folder = tmp_path
    assert plane.audit_events() == []
