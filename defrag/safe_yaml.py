"""YAML for files people hand us (rule files, settings, snapshots): safe, bounded, one-line errors.

``yaml.safe_load`` builds no arbitrary objects, but it still follows aliases: a "billion laughs"
document (ten aliases of ten aliases of …, a few hundred bytes) becomes a structure whose walk
never ends, and a few thousand ``[`` nest deeper than Python's recursion limit. The
:class:`BoundedLoader` here keeps anchors and aliases (a rule file may share a block), but
counts the nodes every alias stands for and refuses a document once that total passes
:data:`MAX_ALIAS_NODES`; it refuses nesting deeper than :data:`MAX_DEPTH`. Both are
``yaml.MarkedYAMLError``s carrying the line, and :func:`one_line` turns any YAML error into
``line L column C: problem``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_ALIAS_NODES = 10_000
"""Nodes all aliases of one document may stand for together (a shared block of a rule file is
tens; a billion-laughs document is 10^9)."""

MAX_DEPTH = 100
"""Nesting of mappings and sequences; a Kubernetes object nests about 15 deep."""


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` with alias expansion and nesting bounded (see the module docstring)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}

    def compose_document(self) -> Node | None:
        self._alias_nodes = 0
        self._sizes = {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if node is not None:
                self._alias_nodes += self._size(node)
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise ComposerError(
                        None,
                        None,
                        f"aliases expand to more than {MAX_ALIAS_NODES:,} nodes (an alias bomb?)",
                        event.start_mark,
                    )
            return node
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()
                raise ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _size(self, node: Node) -> int:
        """Nodes under ``node``, every alias counted as what it stands for (memoised, so a
        shared node is measured once)."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(self._size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(self._size(k) + self._size(v) for k, v in node.value)
        self._sizes[id(node)] = total
        return total


def load(text: str) -> Any:
    """One YAML document, bounded (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=BoundedLoader)


def load_all(text: str) -> Iterator[Any]:
    """Every document of a YAML stream, bounded (raises ``yaml.YAMLError``)."""
    return yaml.load_all(text, Loader=BoundedLoader)


def compose(text: str) -> Node | None:
    """The node tree of one document (for line numbers), bounded."""
    return yaml.compose(text, Loader=BoundedLoader)


def one_line(exc: yaml.YAMLError, label: str = "") -> str:
    """``line L column C: <label>problem`` (no position when the error carries no mark)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "cannot parse"
        if mark is not None:
            return f"line {mark.line + 1} column {mark.column + 1}: {label}{problem}"
        return f"{label}{problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character
        code = char if isinstance(char, int) else ord(char)
        return (
            f"{label}character U+{code:04X} at offset {exc.position} is not allowed in YAML "
            "(a binary file?)"
        )
    return label + " ".join(str(exc).split())


def mark_line(exc: yaml.YAMLError) -> int:
    """The 1-based line of a YAML error, 0 when it has none."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            return int(mark.line) + 1
    return 0
