"""Label and node selectors, evaluated as the Kubernetes scheduler evaluates them.

- A :class:`Requirement` is one ``matchExpressions`` entry: ``In``, ``NotIn``, ``Exists``,
  ``DoesNotExist`` (label selectors and node selectors), ``Gt``, ``Lt`` (node selectors only: the
  label value and the one given value are parsed as integers; a missing or non-integer label
  does not match).
- A :class:`NodeSelectorTerm` ANDs its ``matchExpressions`` (on labels) and ``matchFields`` (on
  fields; ``metadata.name`` is the only field the API admits). A term with neither matches no
  node.
- A :class:`NodeSelector` ORs its terms (``requiredDuringSchedulingIgnoredDuringExecution``).

Semantics follow ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity`` and
``k8s.io/apimachinery/pkg/labels`` (``NotIn`` and ``DoesNotExist`` match an absent label).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
NODE_NAME_FIELD = "metadata.name"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        present = self.key in labels
        if op == "In":
            return present and labels[self.key] in self.values
        if op == "NotIn":
            return not present or labels[self.key] not in self.values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        if op in ("Gt", "Lt"):
            if not present or len(self.values) != 1:
                return False
            try:
                have, bound = int(labels[self.key]), int(self.values[0])
            except ValueError:
                return False
            return have > bound if op == "Gt" else have < bound
        return False

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} [{', '.join(self.values)}]"


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        if not self.expressions and not self.fields:
            return False
        node_fields = {NODE_NAME_FIELD: name}
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches(node_fields) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """The required node affinity: any term may match."""

    terms: tuple[NodeSelectorTerm, ...]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        return any(term.matches(labels, name) for term in self.terms)


def labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A ``nodeSelector`` / ``matchLabels`` map: every pair must be present."""
    return all(labels.get(k) == v for k, v in selector.items())
