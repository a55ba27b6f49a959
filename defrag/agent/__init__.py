"""The node agent process (``defrag agent``): NVML in, a node annotation and /metrics out."""
