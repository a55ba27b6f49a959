"""Detection rules: YAML files → typed rules, errors with file, line and field.

A rule file holds ``rules:``, a list of rules; each names its ``detector`` and carries that
detector's settings, PromQL, severity and action. The rule models are the registered
detectors' (:mod:`defrag.detectors.registry`); this module only finds the files (one lookup,
:func:`rules_paths`, for every command) and loads them. Every problem in every file is
collected and reported as ``file:line: field: message`` (:class:`RulesError`); line numbers
come from the YAML node marks. See docs/rules.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model

from defrag import detectors, safe_yaml
from defrag.detectors import registry
from defrag.detectors.rulemodel import RuleModel, parse_duration

_RULE_FILES: dict[int, type[BaseModel]] = {}


def rule_file_model() -> type[BaseModel]:
    """The model of a rule file: ``rules:``, each rule one of the registered detectors' rule
    models, told apart by ``detector`` (rebuilt when a detector is registered or removed)."""
    version = registry.version()
    if version not in _RULE_FILES:
        models = tuple(d.model for d in registry.detectors())
        one: Any = (
            Annotated[Union[models], Field(discriminator="detector")]  # noqa: UP007
            if len(models) > 1
            else models[0]
        )
        _RULE_FILES.clear()
        _RULE_FILES[version] = create_model("RuleFile", rules=(list[one], ...))
    return _RULE_FILES[version]


# --- loading -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleIssue:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        # a key read from the file may hold a line break: shown escaped, the issue stays a line
        field = self.field if self.field.isprintable() else repr(self.field)[1:-1]
        return f"{where}: {field}: {self.message}" if field else f"{where}: {self.message}"


class RulesError(ValueError):
    """Every problem found in the rule files, one per line."""

    def __init__(self, issues: Sequence[RuleIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass(frozen=True, slots=True)
class LoadedRule:
    """A rule with where it came from: its file and the line of each of its fields."""

    rule: RuleModel
    file: str
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, hash=False)
    index: int = 0
    """Position in its file's ``rules:`` list (field paths in errors are ``rules[index].…``)."""

    def line_of(self, path: str) -> int:
        return self.lines.get(path, self.line)


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[LoadedRule, ...] = ()

    def __iter__(self) -> Iterator[LoadedRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def enabled(self, detector: str | None = None) -> list[LoadedRule]:
        return [
            r
            for r in self.rules
            if r.rule.enabled and (detector is None or r.rule.detector == detector)
        ]


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """The YAML files named, or directly inside the directories named (sorted)."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            out.append(path)
    return out


def default_rules_dir() -> Path:
    """The rules shipped inside the package (``defrag/data/rules``; in a source checkout a link
    to the top-level ``rules/``)."""
    return Path(str(resources.files("defrag") / "data" / "rules"))


def rules_paths(
    explicit: Iterable[str | Path] = (), setting: str | Path | None = None
) -> list[Path]:
    """The one rules lookup: the paths given (``--rules``), else the setting
    (``detection.rules_dir``, i.e. ``$DEFRAG_DETECTION__RULES_DIR``), else the packaged
    defaults."""
    given = [Path(p) for p in explicit]
    if given:
        return given
    chosen = setting or os.environ.get("DEFRAG_DETECTION__RULES_DIR")
    return [Path(chosen)] if chosen else [default_rules_dir()]


def load_rules(paths: Iterable[str | Path] | None = None) -> RuleSet:
    """Load every rule file (default: :func:`rules_paths`); raise :class:`RulesError`
    listing all problems of all files."""
    issues: list[RuleIssue] = []
    loaded: list[LoadedRule] = []
    paths = rules_paths(paths or ())
    files = rule_files(paths)
    if not files:
        raise RulesError([RuleIssue(", ".join(map(str, paths)), 0, "", "no rule files found")])
    for path in files:
        file_rules, file_issues = _load_file(path)
        loaded.extend(file_rules)
        issues.extend(file_issues)
    seen: dict[str, LoadedRule] = {}
    for item in loaded:
        first = seen.setdefault(item.rule.name, item)
        if first is not item:
            issues.append(
                RuleIssue(
                    item.file,
                    item.line_of("name"),
                    "name",
                    f"duplicate rule name {item.rule.name!r} (first at {first.file}:"
                    f"{first.line_of('name')})",
                )
            )
    if issues:
        raise RulesError(issues)
    return RuleSet(tuple(loaded))


def _load_file(path: Path) -> tuple[list[LoadedRule], list[RuleIssue]]:
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return [], [RuleIssue(name, 0, "", f"cannot read: {exc.strerror}")]
    except UnicodeDecodeError as exc:
        return [], [
            RuleIssue(
                name,
                0,
                "",
                f"not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                f"at offset {exc.start}; a binary file?)",
            )
        ]
    try:
        root = safe_yaml.compose(text)
        data = safe_yaml.load(text)
    except yaml.MarkedYAMLError as exc:
        line = safe_yaml.mark_line(exc)
        return [], [RuleIssue(name, line, "", f"YAML syntax: {exc.problem or exc.context}")]
    except yaml.YAMLError as exc:
        return [], [RuleIssue(name, 0, "", safe_yaml.one_line(exc, "YAML: "))]
    if not isinstance(data, dict):
        return [], [RuleIssue(name, 1, "", "a rule file is a mapping with a 'rules:' list")]
    try:
        parsed = rule_file_model().model_validate(data)
    except ValidationError as exc:
        found = [_issue(name, root, err) for err in exc.errors()]
        return [], sorted(found, key=lambda i: (i.line, i.field))
    rules_node = _child(root, "rules")
    out = []
    for i, rule in enumerate(parsed.rules):  # type: ignore[attr-defined]
        node = _child(rules_node, i)
        line = node.start_mark.line + 1 if node is not None else 0
        out.append(LoadedRule(rule, name, line, _field_lines(node), i))
    return out, []


def _issue(file: str, root: yaml.Node | None, err: Any) -> RuleIssue:
    loc = list(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("detector")
    known = registry.names()
    tag = next((p for p in loc if isinstance(p, str) and p in known), None)
    node, path = root, []
    for part in loc:
        child = _child(node, part)
        if child is None:
            if isinstance(part, str) and part in known:
                continue  # the discriminated union's tag is not a YAML key
            if isinstance(part, str):
                path.append(part)
            break
        node = child
        path.append(f"[{part}]" if isinstance(part, int) else str(part))
    line = node.start_mark.line + 1 if node is not None else 0
    dotted = ".".join(path).replace(".[", "[")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        moved = registry.get(tag).moved if tag is not None else {}
        message = moved.get(str(loc[-1]), "unknown field")
    elif err["type"] == "missing":
        message = "required field missing"
    return RuleIssue(file, line, dotted, message)


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int):
        return node.value[key] if 0 <= key < len(node.value) else None
    return None


def _field_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Dotted field path → line, for every key under a rule's mapping."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                path = f"{prefix}{k.value}"
                out[path] = k.start_mark.line + 1
                out.update(_field_lines(v, path + "."))
    return out


__all__ = [
    "LoadedRule",
    "RuleIssue",
    "RuleSet",
    "RulesError",
    "default_rules_dir",
    "detectors",
    "load_rules",
    "parse_duration",
    "rule_file_model",
    "rule_files",
    "rules_paths",
]
