"""A small OpenID Connect provider over real HTTP, for login tests of the hub's OAuthenticator
setup: the authorization-code flow with PKCE (S256, checked), client authentication at the
token endpoint (form or HTTP Basic), and a userinfo endpoint. It signs nobody in by itself:
``user`` is who the next authorization returns, as if that person had typed their password
at the provider.

Why not a mock: OAuthenticator's real code makes the real requests (redirect, token exchange,
userinfo) against it, as it would against Keycloak or Entra ID; only the provider is small.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse


@dataclass
class OidcProvider:
    client_id: str
    client_secret: str
    user: dict[str, Any] = field(default_factory=dict)
    _codes: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    _tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def settings(self, callback_url: str) -> dict[str, Any]:
        """GenericOAuthenticator settings for this provider (what a chart's hub.config holds)."""
        return {"client_id": self.client_id, "client_secret": self.client_secret,
                "oauth_callback_url": callback_url, "authorize_url": f"{self.url}/auth",
                "token_url": f"{self.url}/token", "userdata_url": f"{self.url}/userinfo",
                "scope": ["openid", "email", "groups"], "username_claim": "email"}

    def start(self) -> OidcProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                url = urlparse(self.path)
                if url.path == "/auth":
                    self._authorize({k: v[0] for k, v in parse_qs(url.query).items()})
                elif url.path == "/userinfo":
                    kind, _, token = self.headers.get("Authorization", "").partition(" ")
                    user = provider._tokens.get(token) if kind.lower() == "bearer" else None
                    self._json(200 if user else 401, user or {"error": "invalid_token"})
                else:
                    self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:  # noqa: N802
                if urlparse(self.path).path != "/token":
                    self._json(404, {"error": "not_found"})
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                form = {k: v[0] for k, v in parse_qs(body).items()}
                kind, _, creds = self.headers.get("Authorization", "").partition(" ")
                if kind.lower() == "basic":
                    cid, _, secret = base64.b64decode(creds).decode().partition(":")
                else:
                    cid, secret = form.get("client_id", ""), form.get("client_secret", "")
                if (cid, secret) != (provider.client_id, provider.client_secret):
                    self._json(401, {"error": "invalid_client"})
                    return
                grant = provider._codes.pop(form.get("code", ""), None)
                verifier = form.get("code_verifier", "")
                challenge = base64.urlsafe_b64encode(
                    hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
                if grant is None or grant[0] != form.get("redirect_uri") or (
                        grant[1] and grant[1] != challenge):
                    self._json(400, {"error": "invalid_grant"})
                    return
                token = secrets.token_urlsafe(24)
                provider._tokens[token] = grant[2]
                self._json(200, {"access_token": token, "token_type": "Bearer",
                                 "expires_in": 300, "scope": "openid email groups"})

            def _authorize(self, query: dict[str, str]) -> None:
                if query.get("client_id") != provider.client_id or not query.get("redirect_uri"):
                    self._json(400, {"error": "invalid_request"})
                    return
                code = secrets.token_urlsafe(16)
                provider._codes[code] = (query["redirect_uri"],
                                         query.get("code_challenge", ""), dict(provider.user))
                target = f"{query['redirect_uri']}?" + urlencode(
                    {"code": code, "state": query.get("state", "")})
                self.send_response(302)
                self.send_header("Location", target)
                self.end_headers()

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
