"""A real ``distributed`` cluster on loopback: a scheduler and single-threaded workers, each a
process of its own, started by distributed's own command lines
(``distributed/cli/dask_scheduler.py``, ``distributed/cli/dask_worker.py``). The sweep tests
kill its workers; the sweep benchmark times it against the local runner."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.binaries import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Loopback:
    """A scheduler and its workers, each a process of its own."""

    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        """The workers and the scheduler: SIGTERM, and SIGKILL for one that lingers."""
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_loopback(tmp: Path, workers: int = 2, code: Path = ROOT) -> Loopback:
    """``workers`` workers running the defrag found at ``code``, each logging to ``tmp``; once
    all have joined. RuntimeError with the logs' ends when they do not."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(code)}
    log = (tmp / "scheduler.log").open("wb")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp,
    )  # fmt: skip
    cluster = Loopback(address, scheduler)
    try:
        for i in range(workers):
            wlog = (tmp / f"worker-{i}.log").open("wb")
            argv = [sys.executable, "-m", "distributed.cli.dask_worker", address,
                    "--nthreads", "1", "--nworkers", "1", "--no-nanny", "--no-dashboard",
                    "--name", f"w{i}", "--local-directory", str(tmp / f"w{i}")]  # fmt: skip
            cluster.workers.append(
                subprocess.Popen(argv, stdout=wlog, stderr=subprocess.STDOUT, env=env, cwd=tmp)
            )
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
    except Exception as exc:
        cluster.stop()
        logs = "\n".join(p.read_text(errors="replace")[-800:] for p in tmp.glob("*.log"))
        raise RuntimeError(f"the loopback cluster did not start ({exc}): {logs}") from None
    return cluster
