"""The exit codes of every ``defrag`` command: one table, here, that docs/cli.md repeats and
``tests/test_cli_bad_input.py`` checks it against (code, name and meaning, row by row)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command's exit status says. Each member's docstring line is its meaning in the
    table of docs/cli.md."""

    OK = 0
    NO = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    NO_DATA = 4


MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.NO: "done, and the answer is no",
    ExitCode.BAD_INPUT: "bad input: a flag, a file, a setting, a rule, missing credentials, "
    "a port taken or out of range",
    ExitCode.UNREACHABLE: "a server could not be reached or did not answer in time (the API "
    "server, Prometheus, Alertmanager, the NVIDIA driver): not done, or done in part",
    ExitCode.NO_DATA: "every source answered but held nothing to evaluate",
}
"""One line per code, as docs/cli.md's table says it."""
