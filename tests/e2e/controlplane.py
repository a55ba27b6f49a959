"""A real Kubernetes control plane on loopback, for the end-to-end suite.

etcd, kube-apiserver (x509 client certificates, a ServiceAccount signing key, RBAC, an audit
log), kube-controller-manager (the disruption and ServiceAccount controllers on, the node
lifecycle controllers off: there are no kubelets) and, on demand, kube-scheduler with the shipped
configuration. Everything listens on 127.0.0.1 at a free port, keeps its data in one temporary
folder and is stopped by its PID.

The binaries come from one setting, ``KUBEBUILDER_ASSETS`` (envtest's convention: a folder
holding ``kube-apiserver``, ``kube-controller-manager`` and ``kube-scheduler``; ``etcd`` there
or on PATH). ``make kube-assets`` unpacks them from ``../shared/controlplane``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

from tests.support.binaries import free_port

ASSETS_ENV = "KUBEBUILDER_ASSETS"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
HOW_TO_GET = (
    f"no control plane binaries: set {ASSETS_ENV} to a folder with kube-apiserver, "
    "kube-controller-manager and kube-scheduler (envtest's `setup-envtest use` fetches them; "
    "`make kube-assets` unpacks the project's copy) and install etcd (Debian: etcd-server)"
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


class AssetsMissing(RuntimeError):
    """The binaries are not there; the message says how to get them."""


@dataclass(frozen=True)
class Assets:
    apiserver: Path
    controller_manager: Path
    scheduler: Path
    etcd: Path


def find_assets() -> Assets:
    folder = os.environ.get(ASSETS_ENV, "").strip()
    if not folder:
        raise AssetsMissing(HOW_TO_GET)
    root = Path(folder)
    missing = [name for name in COMPONENTS if not os.access(root / name, os.X_OK)]
    if missing:
        raise AssetsMissing(f"{ASSETS_ENV}={root} lacks {', '.join(missing)}; {HOW_TO_GET}")
    etcd = root / "etcd" if os.access(root / "etcd", os.X_OK) else None
    if etcd is None:
        found = shutil.which("etcd")
        if found is None:
            raise AssetsMissing(f"etcd not found in {root} nor on PATH; {HOW_TO_GET}")
        etcd = Path(found)
    return Assets(
        root / "kube-apiserver", root / "kube-controller-manager", root / "kube-scheduler", etcd
    )


def require_assets() -> Assets:
    """The binaries, or skip the test with the line saying how to get them; under CI, or with
    the setting given but the folder incomplete, fail (a missing part is never a silent skip)."""
    import pytest

    from tests.support.binaries import unavailable

    try:
        return find_assets()
    except AssetsMissing as exc:
        if os.environ.get(ASSETS_ENV):
            pytest.fail(str(exc))
        unavailable(str(exc))


# --- certificates (openssl) ---------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def cert(self, name: str) -> tuple[Path, Path]:
        return self.folder / f"{name}.crt", self.folder / f"{name}.key"


def make_pki(folder: Path, clients: dict[str, str]) -> Pki:
    """A CA, a serving certificate for 127.0.0.1, a client certificate per entry of ``clients``
    (name → subject) and the ServiceAccount key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=folder)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=defrag-e2e-ca",
        "-days",
        "2",
        "-out",
        "ca.crt",
        cwd=folder,
    )
    (folder / "serving.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n"
    )
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject, ext in [
        ("apiserver", "/CN=kube-apiserver", "serving.ext"),
        *((n, s, "client.ext") for n, s in clients.items()),
    ]:
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=folder)
        _openssl(
            "req",
            "-new",
            "-key",
            f"{name}.key",
            "-subj",
            subject,
            "-out",
            f"{name}.csr",
            cwd=folder,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            f"{name}.crt",
            cwd=folder,
        )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)
    return Pki(folder)


# --- kubeconfigs ----------------------------------------------------------------------------


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    cert: tuple[Path, Path] | None = None,
    token: str | None = None,
) -> Path:
    user: dict[str, str] = {}
    if cert is not None:
        user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    if token is not None:
        user = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --- processes ------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn(name: str, argv: list[str], folder: Path, env: dict[str, str] | None = None) -> Process:
    log = folder / f"{name}.log"
    handle = log.open("ab")
    proc = subprocess.Popen(
        argv,
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    handle.close()
    return Process(name, proc, log)


def wait_for(what: str, check: Any, timeout_s: float, process: Process | None = None) -> Any:
    """Poll ``check()`` until it returns a true value; fail with the process's output."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise RuntimeError(
                f"{process.name} exited ({process.proc.returncode}): {process.tail()}"
            )
        try:
            value = check()
        except (requests.RequestException, OSError) as exc:
            last, value = exc, None
        if value:
            return value
        time.sleep(0.1)
    tail = process.tail() if process is not None else ""
    raise TimeoutError(f"{what} not ready after {timeout_s:g} s ({last}): {tail}")


# --- the REST client the harness itself uses (admin, or a token) --------------------------


@dataclass
class Rest:
    """A small REST client on ``requests``: the harness's own calls, kept out of defrag's code
    paths (defrag uses the ``kubernetes`` client)."""

    server: str
    session: requests.Session
    _resources: dict[str, tuple[str, str, bool]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.server + path

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        answer = self.session.get(self.url(path), params=params, timeout=30)
        _raise(answer)
        return dict(answer.json())

    def post(self, path: str, body: dict[str, Any], **params: Any) -> dict[str, Any]:
        answer = self.session.post(self.url(path), json=body, params=params, timeout=30)
        _raise(answer)
        return dict(answer.json())

    def patch(
        self, path: str, body: dict[str, Any], kind: str = "merge", **params: Any
    ) -> dict[str, Any]:
        content_type = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        answer = self.session.patch(
            self.url(path),
            data=json.dumps(body),
            params=params,
            headers={"Content-Type": content_type},
            timeout=30,
        )
        _raise(answer)
        return dict(answer.json())

    def delete(self, path: str, body: dict[str, Any] | None = None) -> requests.Response:
        return self.session.delete(self.url(path), json=body, timeout=30)

    # Discovery: kind → (collection path prefix, plural, namespaced)
    def resource(self, api_version: str, kind: str) -> tuple[str, str, bool]:
        key = f"{api_version}/{kind}"
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for res in self.get(base)["resources"]:
                if "/" not in res["name"]:
                    self._resources[f"{api_version}/{res['kind']}"] = (
                        base,
                        res["name"],
                        bool(res["namespaced"]),
                    )
        if key not in self._resources:
            raise KeyError(f"the API server serves no {key}")
        return self._resources[key]

    def object_path(self, obj: dict[str, Any]) -> str:
        base, plural, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        ns = f"/namespaces/{meta.get('namespace') or 'default'}" if namespaced else ""
        return f"{base}{ns}/{plural}/{meta['name']}"

    def apply(
        self,
        obj: dict[str, Any],
        *,
        dry_run: bool = False,
        manager: str = "defrag-e2e",
        field_validation: str | None = None,
    ) -> requests.Response:
        """Server-side apply (``kubectl apply --server-side``); the raw answer.
        ``field_validation``: ``Strict`` refuses unknown and duplicate fields (``Warn``,
        ``Ignore``: the API server's own choices)."""
        params = {"fieldManager": manager, "force": "true"}
        if dry_run:
            params["dryRun"] = "All"
        if field_validation is not None:
            params["fieldValidation"] = field_validation
        return self.session.patch(
            self.url(self.object_path(obj)),
            data=json.dumps(obj),
            params=params,
            headers={"Content-Type": "application/apply-patch+yaml"},
            timeout=30,
        )


def _raise(answer: requests.Response) -> None:
    if answer.status_code >= 400:
        raise requests.HTTPError(
            f"{answer.request.method} {answer.url}: {answer.status_code} {answer.text[:500]}",
            response=answer,
        )


def rest(
    server: str, ca: Path, *, cert: tuple[Path, Path] | None = None, token: str | None = None
) -> Rest:
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would replace the cluster's CA
    session.verify = str(ca)
    if cert is not None:
        session.cert = (str(cert[0]), str(cert[1]))
    if token is not None:
        session.headers["Authorization"] = f"Bearer {token}"
    return Rest(server, session)


# --- the control plane ----------------------------------------------------------------------

CLIENTS = {
    "admin": "/O=system:masters/CN=e2e-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
}


@dataclass
class ControlPlane:
    folder: Path
    assets: Assets
    pki: Pki
    server: str
    admin: Rest
    admin_kubeconfig: Path
    processes: dict[str, Process] = field(default_factory=dict)
    scheduler_ports: dict[str, int] = field(default_factory=dict)
    """kube-scheduler name → its secure (HTTPS) port."""

    @property
    def audit_log(self) -> Path:
        return self.folder / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every request the API server has answered so far (level Metadata)."""
        if not self.audit_log.exists():
            return []
        text = self.audit_log.read_text(errors="replace")
        # the API server may be writing a line as it is read: only whole lines are events
        whole = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def token(
        self,
        namespace: str,
        service_account: str,
        *,
        seconds: int = 7200,
        bound_pod: dict[str, Any] | None = None,
    ) -> str:
        """A ServiceAccount token from the TokenRequest API, bound to a pod when asked."""
        spec: dict[str, Any] = {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": seconds}
        if bound_pod is not None:
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": bound_pod["metadata"]["name"],
                "uid": bound_pod["metadata"]["uid"],
            }
        answer = self.admin.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        token = self.token(namespace, name)
        path = self.folder / f"sa-{namespace}-{name}.kubeconfig"
        return write_kubeconfig(path, self.server, self.pki.ca, token=token)

    def as_service_account(self, namespace: str, name: str, **kwargs: Any) -> Rest:
        return rest(self.server, self.pki.ca, token=self.token(namespace, name, **kwargs))

    def start_scheduler(
        self,
        config: dict[str, Any],
        kubeconfig: Path,
        name: str,
        extra: tuple[str, ...] = (),
    ) -> Process:
        """kube-scheduler with ``config`` (a KubeSchedulerConfiguration), ``kubeconfig`` and
        ``extra`` command-line flags; returns once it answers /readyz."""
        connection = {**config.get("clientConnection", {}), "kubeconfig": str(kubeconfig)}
        config = {**config, "clientConnection": connection}
        path = self.folder / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        proc = spawn(
            name,
            [
                str(self.assets.scheduler),
                f"--config={path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--v=2",
                *extra,
            ],
            self.folder,
        )
        self.processes[name] = proc
        self.scheduler_ports[name] = port
        with warnings.catch_warnings():  # its serving certificate is self-signed
            warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            wait_for(
                name,
                lambda: (
                    requests.get(f"https://127.0.0.1:{port}/readyz", verify=False, timeout=2).ok
                ),
                60,
                proc,
            )
        return proc

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            proc.stop()


def start_control_plane(folder: Path) -> ControlPlane:
    assets = find_assets()
    folder.mkdir(parents=True, exist_ok=True)
    pki = make_pki(folder / "pki", CLIENTS)
    processes: dict[str, Process] = {}
    try:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        processes["etcd"] = spawn(
            "etcd",
            [
                str(assets.etcd),
                "--name=e2e",
                f"--data-dir={folder / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ],
            folder,
        )
        wait_for(
            "etcd",
            lambda: requests.get(f"http://127.0.0.1:{etcd_port}/health", timeout=1).ok,
            20,
            processes["etcd"],
        )
        audit_policy = folder / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        processes["kube-apiserver"] = spawn(
            "kube-apiserver",
            [
                str(assets.apiserver),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.cert('apiserver')[0]}",
                f"--tls-private-key-file={pki.cert('apiserver')[1]}",
                f"--client-ca-file={pki.ca}",
                f"--service-account-key-file={pki.folder / 'sa.pub'}",
                f"--service-account-signing-key-file={pki.folder / 'sa.key'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                "--authorization-mode=RBAC",
                "--endpoint-reconciler-type=none",
                "--service-cluster-ip-range=10.96.0.0/24",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={folder / 'audit.log'}",
                "--audit-log-maxsize=1000",
                "--audit-log-mode=blocking",
                "--v=1",
            ],
            folder,
        )
        server = f"https://127.0.0.1:{api_port}"
        admin = rest(server, pki.ca, cert=pki.cert("admin"))
        wait_for(
            "kube-apiserver",
            lambda: admin.session.get(f"{server}/readyz", timeout=2).ok,
            60,
            processes["kube-apiserver"],
        )
        cm_kubeconfig = write_kubeconfig(
            folder / "controller-manager.kubeconfig",
            server,
            pki.ca,
            cert=pki.cert("controller-manager"),
        )
        processes["kube-controller-manager"] = spawn(
            "kube-controller-manager",
            [
                str(assets.controller_manager),
                f"--kubeconfig={cm_kubeconfig}",
                f"--authentication-kubeconfig={cm_kubeconfig}",
                f"--authorization-kubeconfig={cm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.folder / 'sa.key'}",
                f"--root-ca-file={pki.ca}",
                "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller",
                # No pods are ever reclaimed behind the tests' backs.
                "--terminated-pod-gc-threshold=100000",
                "--v=1",
            ],
            folder,
        )
        plane = ControlPlane(
            folder=folder,
            assets=assets,
            pki=pki,
            server=server,
            admin=admin,
            admin_kubeconfig=write_kubeconfig(
                folder / "admin.kubeconfig", server, pki.ca, cert=pki.cert("admin")
            ),
            processes=processes,
        )
        # The ServiceAccount controller makes `default` in every namespace: the controller
        # manager is working once it has.
        wait_for(
            "kube-controller-manager",
            lambda: (
                admin.session.get(
                    f"{server}/api/v1/namespaces/default/serviceaccounts/default", timeout=2
                ).ok
            ),
            60,
            processes["kube-controller-manager"],
        )
        return plane
    except BaseException:
        for proc in reversed(list(processes.values())):
            proc.stop()
        raise


@contextlib.contextmanager
def control_plane(folder: Path) -> Iterator[ControlPlane]:
    plane = start_control_plane(folder)
    try:
        yield plane
    finally:
        plane.stop()
