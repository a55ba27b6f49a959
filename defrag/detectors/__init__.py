"""Detectors at the edge: one folder per detector.

``defrag/detectors/<name>/`` holds a detector whole: ``core.py``, its pure function and settings
(the pure core: no client, no rule model, no registry — the import-linter contract in
pyproject.toml), and ``registration.py``, its rule model, what it fetches through the ports and
its one :func:`~defrag.detectors.registry.register` call. Importing this package registers the
built-in detectors (leak, starvation, fragmentation, idle, spreading); a new detector is one
more folder and one more import line below (docs/architecture.md, "Adding a detector").
"""

from defrag.detectors.fragmentation.registration import FRAGMENTATION as FRAGMENTATION
from defrag.detectors.idle.registration import IDLE as IDLE
from defrag.detectors.leak.registration import LEAK as LEAK
from defrag.detectors.registry import Detector, Inputs, MissingInput, RegistryError, register
from defrag.detectors.spreading.registration import SPREADING as SPREADING
from defrag.detectors.starvation.registration import STARVATION as STARVATION

__all__ = [
    "Detector",
    "Inputs",
    "MissingInput",
    "RegistryError",
    "register",
]
