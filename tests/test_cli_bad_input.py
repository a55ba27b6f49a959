"""No traceback for any user mistake: every ``defrag`` command driven through a table of bad
inputs — a port taken or out of range, an unreachable API server, Prometheus or Alertmanager,
missing credentials or kubeconfig, missing or malformed files, bad values — each answered with
exactly one ``error:`` line naming the thing and an exit code from the one table
(:mod:`defrag.cli.exitcodes`, repeated in docs/cli.md and checked against it here).

The commands are enumerated from the Typer app: a new command without a row here fails
:func:`test_every_command_has_bad_inputs_in_the_table`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from defrag.cli import app
from defrag.cli.exitcodes import MEANING, ExitCode
from tests.support.binaries import free_port

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = str(Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json")
B, U = ExitCode.BAD_INPUT, ExitCode.UNREACHABLE
runner = CliRunner()


@dataclass(frozen=True)
class Case:
    """One bad input: the arguments and environment (``{name}`` filled from :class:`World`),
    the exit code, and what the one ``error:`` line must contain."""

    what: str
    args: tuple[str, ...]
    code: ExitCode
    says: str
    env: dict[str, str] = field(default_factory=dict)


def case(what: str, args: str, code: ExitCode, says: str, **env: str) -> Case:
    return Case(what, tuple(args.split()), code, says, env)


CASES: dict[str, list[Case]] = {
    "run": [
        case("port taken", "run --cluster sim", B, "cannot listen on 127.0.0.1:{taken}",
             DEFRAG_HTTP__PORT="{taken}", DEFRAG_HTTP__HOST="127.0.0.1"),
        case("port out of range", "run --cluster sim --once", B, "http.port",
             DEFRAG_HTTP__PORT="70000"),
        case("API server unreachable", "run --once --kubeconfig {kc_down}", U,
             "the API server at {down}"),
        case("no credentials", "run --once", B, "Kubernetes credentials"),
        case("missing kubeconfig", "run --once --kubeconfig {tmp}/none", B,
             "--kubeconfig {tmp}/none: no such file"),
        case("malformed settings", "run --once --settings {bad_yaml}", B, "bad.yaml"),
        case("malformed rules", "run --once --cluster sim --rules {bad_rules_dir}", B,
             "rules in {bad_rules_dir}"),
        case("bad value", "run --cluster nowhere", B, "--cluster: 'nowhere' is not one of"),
        case("bad duration setting", "run --once --cluster sim", B, "daemon.cycle_interval_s",
             DEFRAG_DAEMON__CYCLE_INTERVAL_S="soon"),
    ],
    "demo": [
        case("bad count", "demo --cycles 0", B, "--cycles"),
        case("missing folder", "demo --plot {tmp}/none/demo.png", B, "no such folder"),
    ],
    "detect": [
        case("Prometheus unreachable", "detect --prometheus {down}", U, "could not be evaluated"),
        case("Alertmanager unreachable", f"detect -s {SNAPSHOT} --alertmanager {{down}}", U,
             "alerts not sent: {down}"),
        case("API server unreachable", "detect --kubeconfig {kc_down}", U,
             "the API server at {down}"),
        case("missing credentials",
             "detect --prometheus {down} --prom-bearer-token-file {tmp}/none", B,
             "--prom-bearer-token-file {tmp}/none: no such file"),
        case("nothing given", "detect", B, "nothing to detect from"),
        case("malformed rules", f"detect -s {SNAPSHOT} -r {{bad_rules}}", B,
             "problem(s) in the rule files"),
        case("malformed snapshot", "detect -s {bad_snapshot}", B, "bad_snapshot.json"),
        case("bad time", f"detect -s {SNAPSHOT} --at tuesday", B, "--at: cannot read"),
        case("bad duration", "detect --prometheus {down} --prom-timeout soon", B,
             "--prom-timeout: cannot read 'soon'"),
    ],
    "extender": [
        case("port taken", f"extender -s {SNAPSHOT} --host 127.0.0.1 --port {{taken}}", B,
             "cannot listen on 127.0.0.1:{taken}"),
        case("port out of range", f"extender -s {SNAPSHOT} --port 70000", B,
             "--port: must be at most 65535, got '70000'"),
        case("API server unreachable", "extender --kubeconfig {kc_down} --port 0", U,
             "the API server at {down}"),
        case("missing kubeconfig", "extender --kubeconfig {tmp}/none", B, "no such file"),
        case("malformed snapshot", "extender -s {bad_snapshot}", B, "bad_snapshot.json"),
        case("bad duration", f"extender -s {SNAPSHOT} --relist-interval 0", B,
             "--relist-interval: must be positive"),
        case("old flag name", f"extender -s {SNAPSHOT} --max-staleness-s 0", B,
             "--max-staleness-s: must be positive"),
        case("missing TLS files",
             f"extender -s {SNAPSHOT} --tls-cert {{tmp}}/c --tls-key {{tmp}}/k", B,
             "--tls-cert {tmp}/c"),
    ],
    "agent": [
        case("port out of range", "agent --port 70000", B, "--port: must be at most 65535"),
        case("bad duration", "agent --interval soon", B, "--interval: cannot read 'soon'"),
        case("no node name", "agent", B, "no node name"),
    ],
    "plan": [
        case("API server unreachable", "plan --kubeconfig {kc_down}", U,
             "the API server at {down}"),
        case("no cluster", "plan", B, "no cluster given"),
        case("malformed snapshot", "plan -s {bad_snapshot}", B, "bad_snapshot.json"),
        case("malformed settings", f"plan -s {SNAPSHOT} --settings {{bad_yaml}}", B, "bad.yaml"),
        case("bad count", f"plan -s {SNAPSHOT} --max-evictions -1", B,
             "--max-evictions: must be at least 0, got '-1'"),
        case("bare number", f"plan -s {SNAPSHOT} --min-age 15", B, "--min-age: give a unit"),
        case("bad choice", f"plan -s {SNAPSHOT} --goal everything", B, "--goal"),
    ],
    "report": [
        case("API server unreachable", "report --kubeconfig {kc_down}", U,
             "the API server at {down}"),
        case("Prometheus unreachable", f"report -s {SNAPSHOT} --prometheus {{down}}", U,
             "Prometheus at {down} is unreachable"),
        case("missing kubeconfig", "report --kubeconfig {tmp}/none", B, "no such file"),
        case("malformed snapshot", "report -s {bad_snapshot}", B, "bad_snapshot.json"),
        case("bad duration", f"report -s {SNAPSHOT} --deadline 0", B, "--deadline"),
        case("missing CA file", f"report -s {SNAPSHOT} --prometheus {{down}} --prom-ca-file "
             "{tmp}/none", B, "--prom-ca-file {tmp}/none"),
    ],
    "place": [
        case("API server unreachable", "place --kubeconfig {kc_down}", U,
             "the API server at {down}"),
        case("bad count", f"place -s {SNAPSHOT} --gpus many", B,
             "--gpus: expected a whole number, got 'many'"),
        case("unknown policy", f"place -s {SNAPSHOT} --policy nope", B, "nope"),
        case("malformed snapshot", "place -s {bad_snapshot}", B, "bad_snapshot.json"),
    ],
    "simulate": [
        case("missing trace", "simulate --trace {tmp}/none.csv --nodes {tmp}/none.csv", B,
             "--trace {tmp}/none.csv: no such file"),
        case("malformed trace", "simulate --trace {bad_csv} --nodes {bad_csv}", B, "bad.csv"),
        case("bad seeds", "simulate --seeds x", B, "--seeds"),
        case("bare number", "simulate --protocol timeline --duration 3", B,
             "--duration: give a unit, e.g. 3h"),
        case("bad count", "simulate --pods 0", B, "--pods: must be at least 1"),
        case("missing folder", "simulate --plot {tmp}/none/f.png", B, "no such folder"),
    ],
    "alerts test": [
        case("Alertmanager unreachable", "alerts test --hold 0 --alertmanager {down}", U,
             "{down}"),
        case("bad duration", "alerts test --alertmanager {down} --hold soon", B, "--hold"),
        case("bad credentials", "alerts test --alertmanager {down} --am-basic-auth alice", B,
             "--am-basic-auth"),
        case("missing token", "alerts test --alertmanager {down} --am-bearer-token-file "
             "{tmp}/none", B, "--am-bearer-token-file {tmp}/none"),
        case("no Alertmanager", "alerts test", B, "--alertmanager: required"),
    ],
    "data fetch": [
        case("missing source", "data fetch --dir {tmp}/data --from file://{tmp}/none", B,
             "cannot download"),
        case("source unreachable", "data fetch --dir {tmp}/data --from {down}", U,
             "{down}/openb_node_list_all_node.csv: cannot download"),
        case("unwritable folder", f"data fetch --dir {SNAPSHOT}/data", B, "--dir"),
    ],
    "data check": [
        case("missing folder", "data check --dir {tmp}/none", B, "--dir {tmp}/none: no such"),
    ],
    "rules check": [
        case("missing path", "rules check {tmp}/none", B, "problem(s) in the rule files"),
        case("malformed rules", "rules check {bad_rules}", B, "problem(s) in the rule files"),
        case("Prometheus unreachable", "rules check --prometheus {down}", U,
             "Prometheus at {down} is unreachable"),
    ],
}  # fmt: skip


def leaf_commands() -> list[str]:
    """Every command a user can run, as typed after ``defrag`` (``alerts test``)."""
    root = get_command(app)
    names = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, (*path, name))
        elif path:
            names.append(" ".join(path))

    walk(root, ())
    return sorted(names)


@dataclass(frozen=True)
class World:
    """The things the bad inputs point at."""

    tmp: Path
    taken: int  # a port something listens on
    down: str  # a URL nothing listens on: the connection is refused at once

    def fill(self, text: str) -> str:
        return text.format(**self.names)

    @property
    def names(self) -> dict[str, str]:
        return {
            "tmp": str(self.tmp),
            "taken": str(self.taken),
            "down": self.down,
            "kc_down": str(self.tmp / "kubeconfig-down"),
            "bad_yaml": str(self.tmp / "bad.yaml"),
            "bad_snapshot": str(self.tmp / "bad_snapshot.json"),
            "bad_rules": str(self.tmp / "rules" / "broken.yaml"),
            "bad_rules_dir": str(self.tmp / "rules"),
            "bad_csv": str(self.tmp / "bad.csv"),
        }


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    import os

    for name in list(os.environ):
        if name.startswith("DEFRAG_") or name in ("KUBECONFIG", "NODE_NAME"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    down = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "kubeconfig-down").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{down}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    (tmp_path / "bad.yaml").write_text("scoring: [unclosed\n")
    (tmp_path / "bad_snapshot.json").write_text('{"apiVersion": "v1", "items": [')
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "broken.yaml").write_text("rules:\n  - name: x\n    kind: nope\n")
    (tmp_path / "bad.csv").write_text("not,an,openb\nfile\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield World(tmp_path, taken.getsockname()[1], down)


def _rows() -> list[tuple[str, Case]]:
    return [(name, c) for name, cases in sorted(CASES.items()) for c in cases]


def _check(world: World, result: object, c: Case) -> None:
    output = result.output  # type: ignore[attr-defined]
    stderr = result.stderr  # type: ignore[attr-defined]
    exception = result.exception  # type: ignore[attr-defined]
    assert exception is None or isinstance(exception, SystemExit), (exception, output)
    assert "Traceback" not in output
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert world.fill(c.says) in errors[0], errors[0]
    assert result.exit_code == c.code, (result.exit_code, output)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("command", "bad"), _rows(), ids=[f"{n}: {c.what}" for n, c in _rows()])
def test_a_bad_input_is_one_error_line_and_a_documented_exit_code(
    world: World, command: str, bad: Case
) -> None:
    args = [world.fill(a) for a in bad.args]
    env = {k: world.fill(v) for k, v in bad.env.items()}
    result = runner.invoke(app, args, env=env)
    _check(world, result, bad)


@pytest.mark.parametrize("command", leaf_commands())
def test_an_unknown_option_is_one_error_line_naming_it(world: World, command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--no-such-option"])
    bad = Case("unknown option", (), B, f"no such option: --no-such-option (see 'defrag {command}")
    _check(world, result, bad)


def test_every_command_has_bad_inputs_in_the_table() -> None:
    assert sorted(CASES) == leaf_commands()
    kinds = {c.what for cases in CASES.values() for c in cases}
    # the kinds of mistake the table must hold somewhere
    for kind in ("port taken", "port out of range", "API server unreachable",
                 "Prometheus unreachable", "Alertmanager unreachable", "missing kubeconfig",
                 "missing credentials", "malformed settings", "malformed rules",
                 "malformed snapshot", "malformed trace", "bad count", "bad duration"):  # fmt: skip
        assert kind in kinds, kind


def test_the_exit_code_table_in_the_docs_is_the_one_in_the_code() -> None:
    """docs/cli.md's *Exit codes* table: one row per :class:`ExitCode`, its name and meaning
    as :data:`MEANING` says them, and no other code."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| ([^|]+) \|", section, re.MULTILINE)
    assert [(int(c), n, m.strip()) for c, n, m in rows] == [
        (int(code), code.name, MEANING[code]) for code in ExitCode
    ]


def test_the_table_uses_only_documented_codes() -> None:
    assert {c.code for cases in CASES.values() for c in cases} <= set(ExitCode)


@pytest.mark.parametrize("command", leaf_commands())
def test_help_shows_what_a_value_is_not_a_python_type(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    options = result.output.split("Options:", 1)[-1]
    # Typer's own names: <int>, <list[Path]>, <str>, TEXT, FLOAT, INTEGER
    assert not re.search(r"<[a-z]|\b(TEXT|FLOAT|INTEGER)\b", options), options


@pytest.mark.parametrize(
    ("args", "says", "code"),
    [
        (["extender", "--port", "70000"], "--port: must be at most 65535", B),
        (["extender", "--kubeconfig", "{kc_down}", "--port", "0"], "the API server at {down}", U),
        (["run", "--cluster", "sim"], "cannot listen on 127.0.0.1:{taken}", B),
    ],
)
def test_in_a_process_of_its_own_too(world: World, args: list[str], says: str, code: int) -> None:
    """The three the issue saw as 50–150 lines of traceback, run as a user runs them."""
    import os

    env = {**os.environ, "DEFRAG_HTTP__PORT": str(world.taken), "DEFRAG_HTTP__HOST": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", "from defrag.cli import main; main()", *map(world.fill, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert world.fill(says) in lines[0]
    assert done.returncode == code


def test_json_output_is_untouched_by_the_error_handler(world: World) -> None:
    result = runner.invoke(app, ["place", "-s", SNAPSHOT, "--gpus", "1", "-o", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["node"]
