"""Detectors at the edge: one module per detector, each holding its one registration.

Importing this package registers the built-in detectors (leak, starvation, fragmentation,
idle). A new detector is one more module here with one :func:`~defrag.detectors.registry.register`
call, imported below (docs/architecture.md, "Adding a detector").
"""

from defrag.detectors import fragmentation, idle, leak, starvation
from defrag.detectors.registry import Detector, Inputs, MissingInput, RegistryError, register

__all__ = [
    "Detector",
    "Inputs",
    "MissingInput",
    "RegistryError",
    "fragmentation",
    "idle",
    "leak",
    "register",
    "starvation",
]
