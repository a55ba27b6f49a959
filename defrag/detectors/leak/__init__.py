"""The leak detector: GPU memory growing steadily towards exhaustion.

``core`` is pure (series in, findings out; in the pure core by the import-linter contract);
``registration`` binds it to its rule model, its queries and its alert. docs/rules.md, "leak".
"""
