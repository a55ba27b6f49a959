"""The Typer application and the shared error type of every command."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from defrag import __version__

if TYPE_CHECKING:  # the CLI imports the model (numpy) only when a command runs
    from defrag.model.cluster import Cluster

try:  # typer ≥ 0.20 carries its own copy of click and only catches that copy's exceptions
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - older typer on plain click
    from click import exceptions as _click_errors  # type: ignore[no-redef]
from typer.core import TyperGroup

from defrag.cli.exitcodes import ExitCode

_ClickException = _click_errors.ClickException


class UserError(_ClickException):
    """A user's mistake (bad file, bad flag, unreachable server): one clear line, no traceback.

    Printed as ``error: <message>`` on stderr; the process exits with ``exit_code`` (an
    :class:`~defrag.cli.exitcodes.ExitCode`, bad input by default).
    """

    exit_code = int(ExitCode.BAD_INPUT)

    def __init__(self, message: str, exit_code: int = ExitCode.BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)

    def show(self, file: IO[Any] | None = None) -> None:
        print(f"error: {self.format_message()}", file=file or sys.stderr)


class DefragGroup(TyperGroup):
    """The ``defrag`` command group: Click's usage errors (an unknown option, a missing value,
    a value of the wrong type) become the one-line ``error: --flag: why`` every other mistake
    is said with, and every option without a metavar of its own gets one from its type
    (``PATH``, ``N``, ``NUMBER``, ``a|b``) instead of Typer's Python type names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in walk_commands(self):
            for param in command.params:
                if param.metavar is None and not getattr(param, "is_flag", False):
                    param.metavar = default_metavar(param)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _click_errors.UsageError as exc:
            raise usage_error(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _click_errors.UsageError as exc:
            raise usage_error(exc) from None


def walk_commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[Any]:
    """``command`` and every command under it (the groups' sub-commands, depth first)."""
    yield command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk_commands(sub, (*path, name))


TEXT_METAVARS: dict[str, str] = {
    "--prometheus": "URL",
    "--alertmanager": "URL",
    "--from": "URL",
    "--at": "TIME",
    "--hold": "DURATION",
    "--timeout": "DURATION",
    "--prom-timeout": "DURATION",
    "--context": "NAME",
    "--policy": "NAME",
    "--defragmenter": "NAME",
    "--cluster-label": "NAME",
    "--node": "NAME",
    "--gpu-model": "NAME",
    "--am-basic-auth": "USER:PASSWORD",
    "--seeds": "N|LIST",
    "--set": "KEY=VALUE",
}
"""What a text option's value is, by the option's name (one name, one meaning, every command):
``--help`` shows these, never ``TEXT``; ``tests/test_cli_bad_input.py`` fails on one missing."""


def default_metavar(param: Any) -> str:
    """What ``--help`` shows for a value of ``param``'s type (an explicit metavar wins)."""
    for name in getattr(param, "opts", ()):
        if name in TEXT_METAVARS:
            return TEXT_METAVARS[name]
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return str(param.name).upper()
    if desc.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices or ())
    annotation = desc.annotation
    if getattr(annotation, "__origin__", None) is list:
        (annotation,) = annotation.__args__
    if desc.is_path or desc.is_file or annotation is Path:
        return "PATH"
    if annotation is int:
        return "N"
    if annotation is float:
        return "NUMBER"
    return "TEXT"


def flag_name(param: Any) -> str:
    """The name a message gives ``param``: its long option (``--max-evictions``) or, for an
    argument, its metavar."""
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    if opts:
        return str(opts[0])
    return str(param.metavar or param.name or "value").upper()


def _reason(exc: Any) -> str:
    """A bad value's reason in the project's words, not pydantic's."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if not callable(errors):
        return str(exc.message)
    (first, *_) = errors() or [{}]
    kind, got, limits = first.get("type", ""), first.get("input"), first.get("ctx") or {}
    shown = repr(got) if isinstance(got, str) else str(got)
    words = {
        "int_parsing": "expected a whole number",
        "int_from_float": "expected a whole number",
        "float_parsing": "expected a number",
        "bool_parsing": "expected true or false",
        "greater_than_equal": f"must be at least {limits.get('ge')}",
        "greater_than": f"must be more than {limits.get('gt')}",
        "less_than_equal": f"must be at most {limits.get('le')}",
        "less_than": f"must be less than {limits.get('lt')}",
        "enum": f"expected {limits.get('expected')}",
        "literal_error": f"expected {limits.get('expected')}",
    }
    if kind in words:
        return f"{words[kind]}, got {shown}"
    text = str(first.get("msg") or exc.message).removeprefix("Value error, ").rstrip(".")
    return text[:1].lower() + text[1:]


def usage_error(exc: Any) -> Any:
    """Click's usage error as one ``error:`` line (a :class:`UserError`, exit 2); the help
    Click prints for a bare group is left as it is."""
    if isinstance(exc, _click_errors.NoArgsIsHelpError):
        return exc
    command = "defrag"
    ctx = exc.ctx
    if ctx is not None:
        command = " ".join(["defrag", *ctx.command_path.split()[1:]])
    param = getattr(exc, "param", None)
    if isinstance(exc, _click_errors.MissingParameter) and param is not None:
        message = f"{flag_name(param)}: required (see '{command} --help')"
    elif isinstance(exc, _click_errors.BadParameter) and param is not None:
        message = f"{flag_name(param)}: {_reason(exc)}"
    else:
        text = exc.format_message().rstrip(".")
        message = f"{text[:1].lower()}{text[1:]} (see '{command} --help')"
    return UserError(message)


app = typer.Typer(
    cls=DefragGroup,
    name="defrag",
    help="Keeps GPU Kubernetes clusters unfragmented.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain errors: one line on stderr, never wrapped into a box
)
console = Console()
err_console = Console(stderr=True)


class Output(StrEnum):
    """``--output``: a table for people (rich on a terminal, tab-separated into a pipe), or
    JSON / YAML for scripts. Every command that prints results takes it."""

    table = "table"
    json = "json"
    yaml = "yaml"


OutputOpt = Annotated[
    Output, typer.Option("--output", "-o", help="table (TSV when piped), json or yaml.")
]
AtOpt = Annotated[
    str | None,
    typer.Option("--at", help="Evaluate at this time: RFC 3339 or unix seconds (default now)."),
]
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="Read the cluster live from this kubeconfig's API server instead of --snapshot.",
    ),
]
ContextOpt = Annotated[
    str | None, typer.Option("--context", help="kubeconfig context (default: current).")
]
SnapshotOpt = Annotated[
    list[Path],
    typer.Option(
        "--snapshot",
        "-s",
        help="JSON/YAML of `kubectl get nodes,pods,pdb -A -o json` (repeatable).",
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="An object defrag cannot read is an error (exit 2), not a warning and left out.",
    ),
]


def PortOpt(help: str, lowest: int = 0) -> Any:
    """A TCP port option: ``lowest``..65535 (0: any free port), checked with the flag's name
    before anything binds."""
    return typer.Option(help=help, min=lowest, max=65535, metavar="PORT")


PromTokenOpt = Annotated[
    Path | None,
    typer.Option("--prom-bearer-token-file", help="File holding a bearer token for Prometheus."),
]
PromCaOpt = Annotated[
    Path | None, typer.Option("--prom-ca-file", help="CA bundle to verify Prometheus's TLS.")
]
PromInsecureOpt = Annotated[
    bool, typer.Option("--prom-insecure", help="Do not verify Prometheus's TLS certificate.")
]
PromTimeoutOpt = Annotated[
    str,
    typer.Option(
        "--prom-timeout", help="Per Prometheus request (10s; bare: seconds).", metavar="DURATION"
    ),
]
DeadlineOpt = Annotated[
    str,
    typer.Option(
        "--deadline",
        help="Wall-clock limit on the whole command (2m, 90s; bare: seconds): every request "
        "to Prometheus, the API server or Alertmanager ends by it.",
        metavar="DURATION",
    ),
]
DEFAULT_DEADLINE = "120s"


@contextmanager
def command_deadline(text: str, command: str) -> Iterator[float]:
    """The command's ``--deadline``: inside the block, every request of this thread ends by it
    (:func:`defrag.adapters.deadline.time_budget`); its own limit still holds when sooner."""
    from defrag.adapters.deadline import time_budget

    seconds = parse_duration(text, "--deadline")
    if seconds <= 0:
        raise UserError(f"--deadline: must be positive, got {text!r}")
    with time_budget(seconds, f"defrag {command}'s deadline of {seconds:g} s (--deadline)"):
        yield seconds


def print_json(data: Any, stream: IO[str] | None = None) -> None:
    """Machine-readable output: plain JSON on stdout, no colour or wrapping."""
    out = stream or sys.stdout
    json.dump(data, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def print_data(data: Any, output: Output) -> None:
    """``-o json`` or ``-o yaml``: the same document either way."""
    if output is Output.yaml:
        # Through JSON first so that every value is a plain type (datetimes as strings).
        plain = json.loads(json.dumps(data, default=str))
        yaml.safe_dump(plain, sys.stdout, sort_keys=False, allow_unicode=True)
    else:
        print_json(data)


def print_table(table: Table, drop: Sequence[str] = (), whole: Sequence[str] = ()) -> None:
    """On a terminal rich fits the table to its width, leaving out the columns named in
    ``drop`` (first named, first left out) while it cannot show every cell whole; the columns
    named in ``whole`` (identities: pod and node names) are never cut or wrapped, the others
    fold to make room. Into a pipe or a file each row is one line of tab-separated cells (title
    as a ``#`` line), never wrapped or cut, every column kept."""
    if console.is_terminal:
        console.print(fit_table(keep_whole(table, whole), console, drop))
        return
    out = sys.stdout
    if table.title:
        out.write(f"# {_plain(table.title)}\n")
    if table.show_header:
        out.write("\t".join(_plain(c.header) for c in table.columns) + "\n")
    columns = [[_plain(cell) for cell in c.cells] for c in table.columns]
    for row in zip(*columns, strict=True):
        out.write("\t".join(row) + "\n")


def keep_whole(table: Table, names: Sequence[str]) -> Table:
    """``table`` with the columns ``names`` as wide as their longest cell and never wrapped;
    every other column folds (a long reason wraps onto more lines instead of cutting a pod
    name to ``inference/ch…``)."""
    if not names:
        return table
    for column in table.columns:
        if _plain(column.header) in names:
            longest = max((len(_plain(c)) for c in [column.header, *column.cells]), default=0)
            column.no_wrap, column.min_width, column.overflow = True, longest, "ignore"
        elif column.overflow == "ellipsis":
            column.overflow = "fold"
    return table


def fit_table(table: Table, on: Console, drop: Sequence[str] = ()) -> Table:
    """``table`` narrowed to ``on``'s width: while its narrowest rendering (each cell's longest
    word) is wider, the next column named in ``drop`` is left out; a caption names those left
    out. Rich would otherwise cut every cell down to ``…``."""
    from rich.measure import Measurement

    unbounded = on.options.update_width(10_000)  # measured against the width, not clamped to it
    left_out: list[str] = []
    for name in drop:
        if Measurement.get(on, unbounded, table).minimum <= on.width:
            break
        index = next((i for i, c in enumerate(table.columns) if _plain(c.header) == name), None)
        if index is not None:
            table.columns.pop(index)
            left_out.append(name)
    if left_out:
        note = f"left out at {on.width} columns: {', '.join(left_out)} (-o json has them all)"
        table.caption = f"{table.caption}\n{note}" if table.caption else note
    return table


def print_line(text: str) -> None:
    """A line for people: rich markup on a terminal, plain text never wrapped into a pipe."""
    if console.is_terminal:
        console.print(text)
    else:
        sys.stdout.write(_plain(text) + "\n")


def _plain(value: object) -> str:
    if isinstance(value, Text):
        return value.plain
    text = Text.from_markup(value) if isinstance(value, str) else Text(str(value))
    return text.plain.replace("\t", " ").replace("\n", " ")


def parse_time(text: str | None, flag: str = "--at") -> datetime:
    """The one time flag: RFC 3339 (``2026-03-02T12:00:00Z``) or unix seconds; default now."""
    if text is None:
        return datetime.now(UTC)
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"{flag}: cannot read {text!r}; use RFC 3339 (2026-03-02T12:00:00Z) or unix seconds"
        ) from None
    from defrag.model.utc import utc  # here: defrag.model loads numpy, the help must not

    return utc(value)


def parse_duration(text: str, flag: str, bare_was: str | None = None) -> float:
    """Seconds in a duration written as Prometheus does (``90s``, ``15m``, ``2h``, ``1h30m``).

    A bare number is seconds, in every option. Where a bare number used to mean another unit
    (``bare_was``: ``m`` for ``plan --min-age``, ``h`` for the ``simulate`` spans), it is
    refused with the spelling that keeps its old meaning, rather than silently read in a new
    unit; ``0`` means the same in every unit and is read."""
    from defrag.settings import duration_seconds

    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if number < 0:
            raise UserError(f"{flag}: must not be negative, got {text!r}")
        if bare_was is not None and number != 0:
            unit = {"m": "minutes", "h": "hours"}[bare_was]
            raise UserError(
                f"{flag}: give a unit, e.g. {text}{bare_was} ({text} alone meant {unit} "
                "here before; a bare number is seconds in every other option)"
            )
        return number
    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def load_cluster(
    paths: Sequence[Path],
    kubeconfig: Path | None = None,
    context: str | None = None,
    strict: bool = False,
) -> Cluster:
    """One snapshot of the cluster the flags name (defrag/adapters/sources.py: snapshot files,
    or the live API through ``--kubeconfig``, or in-cluster inside a pod). What cannot be read
    (or, ``strict``, any object that cannot) is a UserError naming file and field; objects left
    out or counted conservatively are said on stderr."""
    return load_live_cluster(paths, kubeconfig, context, strict)[0]


def load_live_cluster(
    paths: Sequence[Path],
    kubeconfig: Path | None = None,
    context: str | None = None,
    strict: bool = False,
) -> tuple[Cluster, Any]:
    """:func:`load_cluster`, with the live API client it was read through (None for snapshot
    files), for a command that reads more of the cluster."""
    from defrag.adapters.sources import SourceError, SourceSpec, SourceUnreachable, open_source

    try:
        spec = SourceSpec.from_flags(paths, kubeconfig, context, strict=strict)
        backend = open_source(spec)
    except SourceUnreachable as exc:
        raise UserError(str(exc), ExitCode.UNREACHABLE) from None
    except SourceError as exc:
        raise UserError(str(exc)) from None
    try:
        cluster = backend.source.snapshot()
    except SourceError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # the client's own errors: refused, cut off, timed out, …
        if backend.api is None:
            raise
        raise UserError(f"{api_server(backend.api)}: {exc}", ExitCode.UNREACHABLE) from None
    say_warnings(cluster)
    return cluster, backend.api


def api_server(api: Any) -> str:
    """ "the API server at <url>" of a live client, for a message (no credentials)."""
    from defrag.redact import redact_url

    host = getattr(getattr(api, "configuration", None), "host", None)
    return f"the API server at {redact_url(str(host))}" if host else "the API server"


def say_warnings(cluster: Cluster) -> None:
    """One ``warning:`` line on stderr per object the source could not model fully."""
    for warning in cluster.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def writable_path(path: Path, flag: str, suffix: str | None = None) -> Path:
    """Check an output path before the work starts: its folder exists and can be written."""
    if suffix is not None and path.suffix.lower() != suffix:
        raise UserError(f"{flag} {path}: the file must end in {suffix}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: no such folder {folder}")
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{flag} {path}: not writable")
    return path


def _version(value: bool) -> None:
    if value:
        print(f"defrag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Keeps GPU Kubernetes clusters unfragmented."""


def main() -> None:
    """Console-script entry point."""
    app(prog_name="defrag")
