"""The fragmentation detector: free GPUs stranded on nodes and in the cluster.

``core`` is pure (a cluster in, findings out); ``registration`` binds it to its rule model and
its alerts. docs/rules.md, "fragmentation".
"""
