"""Adapters: the only modules that talk to Kubernetes, Prometheus, Alertmanager, NVML or files."""
