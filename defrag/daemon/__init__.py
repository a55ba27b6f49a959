"""The daemon process (``defrag run``): one cycle (observe → detect → plan → execute → alert)
on a schedule, with leader election, windows, health and metrics."""
