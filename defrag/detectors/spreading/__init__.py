"""The spreading detector: does the cluster's scheduler spread GPU pods?

``core`` is pure (a cluster in, a verdict and findings out); ``registration`` binds it to its
rule model and its alert. docs/rules.md, "spreading".
"""
