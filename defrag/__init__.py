"""defrag: keeps GPU Kubernetes clusters unfragmented."""

__version__ = "0.1.0"
