"""The scoring configuration of the commands that score: ``--settings`` and ``--policy``.

``defrag extender``, ``report``, ``place``, ``plan`` and ``detect`` read the same settings file
and ``DEFRAG_*`` environment as ``defrag run`` (:func:`defrag.settings.load_settings`), so the
daemon, the extender and the CLI score with one configured profile; an explicit ``--policy``
overrides the file's ``policy``. Each command then builds one
:class:`~defrag.scoring.profile.ScoringProfile` for the cluster it reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from defrag.cli.app import UserError
from defrag.cli.names import POLICY_NAMES

if TYPE_CHECKING:
    from defrag.scoring.profile import ProfileConfig
    from defrag.settings import Settings

SettingsOpt = Annotated[
    Path | None,
    typer.Option(
        "--settings",
        help="The daemon's YAML/JSON settings file (its scoring.policy and scoring.seed score "
        "here too); DEFRAG_* variables apply as for `defrag run`.",
    ),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help=f"Scoring policy, overriding the settings' (one of: {', '.join(POLICY_NAMES)}; "
        "default: the setting, else reserve-binpack).",
    ),
]


def cli_settings(settings_file: Path | None) -> Settings:
    """The settings (file, environment) a command reads; a bad one is a :class:`UserError`."""
    from defrag.redact import redact_text
    from defrag.settings import SettingsError, load_settings

    try:
        return load_settings(settings_file)
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


def profile_config(settings_file: Path | None, policy: str | None) -> ProfileConfig:
    """The configured profile: the settings (file, environment), ``policy`` overriding theirs.
    A bad file or value is a :class:`UserError` naming the file or flag and the field."""
    from defrag.redact import redact_text
    from defrag.settings import SettingsError, load_settings

    try:
        return load_settings(settings_file).profile_config(policy)
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


__all__ = ["PolicyOpt", "SettingsOpt", "cli_settings", "profile_config"]
