"""The starvation detector: high-priority pods pending too long, and why.

``core`` is pure (a cluster in, findings out); ``registration`` binds it to its rule model and
its alert. docs/rules.md, "starvation".
"""
