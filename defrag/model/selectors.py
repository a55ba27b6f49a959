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


class SelectorSyntaxError(ValueError):
    """A label selector string that does not parse; the message names the position."""


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A label selector written as ``kubectl -l`` and ``metav1.LabelSelector`` strings are
    (``k8s.io/apimachinery/pkg/labels.Parse``): requirements separated by commas, all of
    which must hold. ``text`` is what was written (for messages)."""

    requirements: tuple[Requirement, ...]
    text: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return self.text or ",".join(map(str, self.requirements))


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./")
_VALUE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def parse_label_selector(text: str) -> LabelSelector:
    """The set-based grammar of ``labels.Parse``: ``a=b`` / ``a==b`` (In), ``a!=b`` (NotIn:
    an absent label matches), ``a in (x,y)``, ``a notin (x,y)``, ``a`` (Exists), ``!a``
    (DoesNotExist). An empty string selects everything. :class:`SelectorSyntaxError` names
    the offending position and what was expected."""
    parser = _SelectorParser(text)
    return LabelSelector(parser.parse(), text.strip())


class _SelectorParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def fail(self, expected: str) -> SelectorSyntaxError:
        found = repr(self.text[self.i]) if self.i < len(self.text) else "the end"
        return SelectorSyntaxError(
            f"label selector {self.text!r}: at character {self.i + 1}: expected {expected}, "
            f"found {found}"
        )

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def word(self, chars: frozenset[str]) -> str:
        self.skip()
        start = self.i
        while self.i < len(self.text) and self.text[self.i] in chars:
            self.i += 1
        return self.text[start : self.i]

    def take(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.i):
            self.i += len(token)
            return True
        return False

    def at_keyword(self, keyword: str) -> bool:
        self.skip()
        end = self.i + len(keyword)
        if self.text[self.i : end] == keyword and (
            end == len(self.text) or self.text[end].isspace() or self.text[end] == "("
        ):
            self.i = end
            return True
        return False

    def parse(self) -> tuple[Requirement, ...]:
        self.skip()
        if self.i == len(self.text):
            return ()
        found = [self.requirement()]
        while self.take(","):
            found.append(self.requirement())
        self.skip()
        if self.i != len(self.text):
            raise self.fail("',' or the end")
        return tuple(found)

    def key(self) -> str:
        key = self.word(_KEY_CHARS)
        if not key:
            raise self.fail("a label key")
        return key

    def values(self) -> tuple[str, ...]:
        if not self.take("("):
            raise self.fail("'('")
        values = [self.word(_VALUE_CHARS)]
        while self.take(","):
            values.append(self.word(_VALUE_CHARS))
        if not self.take(")"):
            raise self.fail("',' or ')'")
        return tuple(values)

    def requirement(self) -> Requirement:
        if self.take("!"):
            return Requirement(self.key(), "DoesNotExist")
        key = self.key()
        if self.take("!="):
            return Requirement(key, "NotIn", (self.word(_VALUE_CHARS),))
        if self.take("==") or self.take("="):
            return Requirement(key, "In", (self.word(_VALUE_CHARS),))
        if self.at_keyword("notin"):
            return Requirement(key, "NotIn", self.values())
        if self.at_keyword("in"):
            return Requirement(key, "In", self.values())
        self.skip()
        if self.i == len(self.text) or self.text[self.i] == ",":
            return Requirement(key, "Exists")
        raise self.fail("'=', '==', '!=', 'in', 'notin', ',' or the end")
