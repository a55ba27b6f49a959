"""Detectors: pure functions from series and snapshots to findings."""

from defrag.detect.findings import Finding, FindingKind, Severity

__all__ = ["Finding", "FindingKind", "Severity"]
