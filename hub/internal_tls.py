"""Platform traffic on one machine is TLS: JupyterHub's ``internal_ssl``, plus what a machine
shared by people needs on top of it.

Per link (``tunehub up``):

- browser → proxy: the public port, plain HTTP unless the operator gives the proxy a
  certificate (``c.JupyterHub.ssl_cert``/``ssl_key``) or terminates TLS in front of it;
- hub → proxy API: a Unix socket in the hub's root-only state directory (JupyterHub's
  ``http+unix://`` API URL): nobody else can connect to it or bind it first;
- proxy → hub, tuner, notebook servers: TLS with the proxy's client certificate; each backend
  must present the certificate *named* for its route (:mod:`hub.proxy`, :mod:`tunehub_base.tls`);
- notebook servers, the tuner and the culler → hub API: TLS, verifying the hub against CAs that
  sign nothing a person holds (``hub-ca``, ``proxy-client-ca``), so no name check is needed;
- hub → notebook servers and services: TLS with JupyterHub's own client, which checks the CA
  only; it sends them no secret (readiness checks), so a squatter learns nothing from it;
- notebook client and trials → tuner: TLS, verifying the internal CA *and* the tuner's name
  (``TUNEHUB_API_CA`` + :data:`~tunehub_base.tls.SERVICE_IDENTITY`), then a token as before.

What this module adds to JupyterHub's scheme: the internal CA that signs servers and services is
made before the hub starts, so its certificate can be published (``$TUNEHUB_HOME/tls/
internal-ca.crt``, public) for clients that must verify the tuner; a person's server certificate
is named for that person (:func:`create_notebook_certs`), so it cannot stand in for the tuner or
for someone else's server; and it is handed over by the root hub into a root-owned directory, the
key owned by that person alone (:func:`hand_over`). JupyterHub's ``LocalProcessSpawner`` instead
writes into ``~/.jupyterhub`` in the person's home, a path the person controls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunehub_base import tls

#: A Unix socket's path must fit ``sockaddr_un`` (108 bytes with its terminator); a state
#: directory deeper than this keeps the proxy's API on loopback TCP with TLS.
MAX_SOCKET_PATH = 100
#: The CA that signs notebook servers' and services' certificates (JupyterHub's name).
NOTEBOOKS_CA = "notebooks-ca"


@dataclass(frozen=True)
class InternalTls:
    """Where the internal certificates live (``store``: the hub's, root-only) and what is public
    of them (``public``: the CA clients verify the tuner with, and each server's handed-over
    certificate, under ``servers/``)."""

    store: Path
    public: Path

    @property
    def api_ca(self) -> Path:
        return self.public / "internal-ca.crt"

    def prepare(self) -> InternalTls:
        """Make the signing CA now (JupyterHub reuses one it finds, with the same defaults) and
        publish its certificate; root-owned directories, readable files, no secrets."""
        from certipy import Certipy, CertNotFoundError

        certipy = Certipy(store_dir=str(self.store))
        try:
            record = certipy.store.get_record(NOTEBOOKS_CA)
        except CertNotFoundError:
            record = certipy.create_ca(NOTEBOOKS_CA)
        cert = Path(record["files"]["cert"]).read_bytes()
        _private_dir(self.public, 0o711)
        _write(self.api_ca, cert, 0o444)
        return self

    def configure(self, c: Any) -> None:
        """Turn on JupyterHub's internal TLS with its store in the hub's state directory."""
        c.JupyterHub.internal_ssl = True
        c.JupyterHub.internal_certs_location = str(self.store)
        _check_services_as_a_client()
        _one_pair_for_the_services()


def _check_services_as_a_client() -> None:
    """JupyterHub 6.1 checks that a managed service with a URL answers (``start_service``)
    using the TLS context its own *server* listens with, from which no client connection can
    be made ("Cannot create a client socket with a PROTOCOL_TLS_SERVER context"): with
    ``internal_ssl`` every hub start fails. Given such a context, the check makes its own
    client context instead (what it does when given none)."""
    import ssl

    from jupyterhub.app import JupyterHub

    original = JupyterHub.start_service
    if getattr(original, "tunehub_fixed", False):
        return

    async def start_service(self: JupyterHub, service_name: str, service: Any,
                            ssl_context: ssl.SSLContext | None = None) -> bool:
        if ssl_context is not None and ssl_context.protocol == ssl.PROTOCOL_TLS_SERVER:
            ssl_context = None
        return bool(await original(self, service_name, service, ssl_context))

    start_service.tunehub_fixed = True  # type: ignore[attr-defined]
    JupyterHub.start_service = start_service  # type: ignore[method-assign]


def _one_pair_for_the_services() -> None:
    """JupyterHub makes a managed service's key pair as the service starts, named by its Unix
    user (``user-service`` for the tuner and the idle culler alike: :data:`tls.SERVICE_IDENTITY`),
    and writes the files in place. So the culler's start rewrote the tuner's key and
    certificate while the tuner was reading them: "PEM lib" in the tuner's first request to
    the hub, a 500 (seen once, right after a hub restart). Here the pair is made once per hub
    process, by the first service that starts, and the others are given the same files."""
    from jupyterhub.services.service import _ServiceSpawner

    original = _ServiceSpawner.create_certs
    if getattr(original, "tunehub_fixed", False):
        return
    made: dict[tuple[str, str], dict[str, str]] = {}

    async def create_certs(self: Any) -> dict[str, str]:
        key = (str(self.internal_certs_location), str(self.user.name))
        if key not in made:
            made[key] = dict(await original(self))
        return dict(made[key])

    create_certs.tunehub_fixed = True  # type: ignore[attr-defined]
    _ServiceSpawner.create_certs = create_certs  # type: ignore[method-assign]


def _private_dir(path: Path, mode: int) -> None:
    """A directory of root's (or the hub user's) own: made if missing, never a link."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise RuntimeError(f"{path} must be a directory of the platform's own")
    os.chown(path, os.geteuid(), os.getegid())
    os.chmod(path, mode)


def _write(path: Path, content: bytes, mode: int, uid: int | None = None) -> None:
    """Write a file the platform owns the directory of: replaced whole, never followed."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, content)
        if uid is not None:
            os.fchown(fd, uid, -1)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_notebook_certs(store: str, user: str, trust_bundle: str) -> dict[str, str]:
    """As JupyterHub's ``Spawner.create_certs``, but named for the person
    (:func:`tunehub_base.tls.notebook_identity`) instead of ``user-<name>``: with JupyterHub's
    name a person called ``service`` would hold a certificate named like the tuner's."""
    from certipy import Certipy

    pair = Certipy(store_dir=store).create_signed_pair(
        tls.notebook_identity(user), NOTEBOOKS_CA,
        alt_names=["DNS:localhost", "IP:127.0.0.1"], overwrite=True)
    return {"keyfile": pair["files"]["key"], "certfile": pair["files"]["cert"],
            "cafile": trust_bundle}


def hand_over(paths: dict[str, str], public: Path, login: str, uid: int) -> dict[str, str]:
    """Give a person's server its key, certificate and CA bundle: copied by the hub into
    ``<public>/servers/<login>/``, a directory of root's (others cannot list it, nobody else
    can put anything there); the key owned by that person, readable by them only. The key's
    copy in the store is removed."""
    servers = public / "servers"
    _private_dir(servers, 0o711)
    target = servers / login
    _private_dir(target, 0o711)
    out = {}
    for kind, mode in (("keyfile", 0o400), ("certfile", 0o444), ("cafile", 0o444)):
        source = Path(paths[kind])
        dest = target / {"keyfile": "server.key", "certfile": "server.crt",
                         "cafile": "ca-bundle.crt"}[kind]
        _write(dest, source.read_bytes(), mode, uid=uid if kind == "keyfile" else None)
        out[kind] = str(dest)
    Path(paths["keyfile"]).unlink(missing_ok=True)
    return out

