"""Finding the real binaries integration tests run. Under CI=true a missing one fails the test."""

from __future__ import annotations

import os
import shutil
import socket

import pytest


def require_binary(name: str) -> str:
    """Path of ``name``; skip locally when it is missing, fail under CI (never skip silently)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found on PATH (make tools installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
