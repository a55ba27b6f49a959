"""The cluster simulator: trace loading, synthetic workloads, fill and timeline protocols."""
