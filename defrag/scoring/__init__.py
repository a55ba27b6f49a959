"""Scoring: filters, the policy registry, the scheduler and fragmentation metrics."""
