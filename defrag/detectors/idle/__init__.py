"""The idle detector: the cluster's GPUs quiet for a while (the gate for execution windows).

``core`` is pure; ``registration`` binds it to its rule model and its query. docs/rules.md,
"idle".
"""
