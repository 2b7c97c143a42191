"""Who is at the other end of a platform connection: TLS with JupyterHub's internal CAs, and the
name each component's certificate carries.

JupyterHub's ``internal_ssl`` signs every notebook server's certificate and every service's
with one CA (``notebooks-ca``), all for ``127.0.0.1``. On a machine shared by people that is not
enough: each person can read their own server's key, so a person who binds the tuner's port (or
another person's server port) while it is free could present a certificate the CA vouches for.
What tells them apart is the certificate's common name, which the platform chooses and only the
platform signs: ``hub-internal`` for the hub, ``user-service`` for the hub's services (the tuner;
their keys stay in the hub's root-only directory) and :func:`notebook_identity` for a person's
server. A client here verifies the chain, the address *and* the name it expects
(:func:`pinned_client_context`), so a squatter gets a failed handshake, never a request.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
from collections.abc import Mapping
from typing import Any

#: The CA file that vouches for the tuner (the internal ``notebooks-ca``), set by the platform
#: for notebook servers and trials next to ``TUNEHUB_API_URL``.
ENV_API_CA = "TUNEHUB_API_CA"
#: The common name of the hub's own certificate (JupyterHub's ``hub-internal``).
HUB_IDENTITY = "hub-internal"
#: The common name JupyterHub gives a managed service's certificate (``user-`` + the service's
#: Unix user, none: ``service``). Only the hub's services, run by the hub, hold such a key:
#: people's servers are named by :func:`notebook_identity`, which never gives this name.
SERVICE_IDENTITY = "user-service"
#: The common name of the hub proxy's client certificate (JupyterHub's ``proxy-client``, signed
#: by its own ``proxy-client-ca``; the key stays in the hub's root-only directory). The one
#: client whose forwarded-address headers a server believes (:mod:`tunehub_base.request_bounds`).
PROXY_IDENTITY = "proxy-client"

_PLAIN_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,47}")


def notebook_identity(user: str) -> str:
    """The common name of ``user``'s notebook server certificate (also its file name in the
    CA's store, so plain characters and at most 64 of them; other names are hashed)."""
    if _PLAIN_NAME.fullmatch(user):
        return f"notebook-{user}"
    return "notebook-" + hashlib.sha256(user.encode()).hexdigest()[:32]


def _peer_name(cert: Mapping[str, Any] | None) -> str | None:
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def peer_identity(sock: object) -> str | None:
    """The common name of the certificate the peer of ``sock`` presented and the handshake
    verified; None for a plain socket, or a TLS peer that presented none."""
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return None
    try:
        return _peer_name(getpeercert())
    except (ValueError, OSError):  # not connected, or the handshake is not done
        return None


def _check_identity(expected: str, cert: Mapping[str, Any] | None) -> None:
    name = _peer_name(cert)
    if name != expected:
        # SSL_ERROR_SSL first, as OpenSSL's own failures: tornado then closes the connection
        # with one warning instead of logging a traceback.
        raise ssl.SSLCertVerificationError(
            ssl.SSL_ERROR_SSL,
            f"the server's certificate names {name!r}, not {expected!r}: some other process "
            "holds this port")


class _PinnedSocket(ssl.SSLSocket):
    """A TLS socket whose handshake fails unless the peer's certificate names the identity its
    context expects (blocking sockets, and tornado's non-blocking handshake)."""

    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        _check_identity(self.context.tunehub_identity, self.getpeercert())  # type: ignore[attr-defined]


class _PinnedObject(ssl.SSLObject):
    """The same check for asyncio's and anyio's memory-BIO TLS."""

    def do_handshake(self) -> None:
        super().do_handshake()
        _check_identity(self.context.tunehub_identity, self.getpeercert())  # type: ignore[attr-defined]


def pinned_client_context(
    cafile: str, identity: str, certfile: str | None = None, keyfile: str | None = None
) -> ssl.SSLContext:
    """A client context that trusts only ``cafile`` and only a server whose certificate is
    named ``identity`` (besides matching the address). ``certfile``/``keyfile``: this client's
    own certificate, for servers that ask for one."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if certfile:
        context.load_cert_chain(certfile, keyfile)
    context.tunehub_identity = identity  # type: ignore[attr-defined]
    context.sslsocket_class = _PinnedSocket
    context.sslobject_class = _PinnedObject
    return context


def server_context(certfile: str, keyfile: str, client_ca: str | None,
                   require_client_cert: bool) -> ssl.SSLContext:
    """A server context with this component's certificate. Clients' certificates are checked
    against ``client_ca`` when presented; ``require_client_cert``: a client without one is
    refused during the handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    context.load_cert_chain(certfile, keyfile)
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def api_context(environ: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """How a notebook's client or a trial verifies the tuner: the CA the platform named in
    ``TUNEHUB_API_CA`` and the tuner's name; None where the platform named none (plain HTTP
    inside a cluster, or a URL given by hand)."""
    cafile = (os.environ if environ is None else environ).get(ENV_API_CA)
    return pinned_client_context(cafile, SERVICE_IDENTITY) if cafile else None
