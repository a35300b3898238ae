"""Credentials a bearer token can be (runtime/auth.py decides who calls with them): static
tokens from a file, and JWTs checked against an identity provider's key set.

Static tokens are kept as SHA-256 digests (a dump of the process does not hand them
out) and the file is re-read when it changes; JWT keys come from a JWKS file or URL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from echelon.core.acl import Identity
from echelon.contract.errors import Unauthenticated

log = logging.getLogger("echelon.auth")

RELOAD_CHECK = 1.0  # seconds between looks at the tokens file
JWKS_REFETCH = 30.0  # seconds between fetches of a JWKS URL for an unknown kid
JWKS_TIMEOUT = 5.0


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: str) -> dict[str, Identity]:
    """sha256(token) -> identity, from a tokens file; ValueError names what is wrong."""
    try:
        rows = json.loads(Path(path).read_text())["tokens"]
        out = {}
        for row in rows:
            if not row["token"] or not row["name"]:
                raise ValueError("empty token or name")
            out[_digest(row["token"])] = Identity(row["name"], frozenset(row.get("groups", ())),
                                                  bool(row.get("member", False)))
        return out
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a tokens file ({type(e).__name__}: {e})") from None


class StaticTokens:
    """Static bearer tokens from a file, re-read when it changes."""

    def __init__(self, path: str):
        self.path = path
        self._mtime = _stamp(os.stat(path))
        self._tokens = load_tokens(path)
        self._checked = time.monotonic()

    def identify(self, token: str) -> Identity:
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK:
            self._checked = now
            self._reload()
        identity = self._tokens.get(_digest(token))
        if identity is None:
            raise Unauthenticated("unknown token")
        return identity

    def _reload(self) -> None:
        try:
            mtime = _stamp(os.stat(self.path))
            if mtime != self._mtime:
                self._tokens, self._mtime = load_tokens(self.path), mtime
                log.info("tokens reloaded from %s (%d tokens)", self.path, len(self._tokens))
        except (OSError, ValueError) as e:  # keep the last good set
            log.warning("tokens file not reloaded: %s", e)


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a changed file: its mtime alone misses two writes within one tick of the
    file system's clock (a few milliseconds), so its size and inode too (a replaced file)."""
    return st.st_mtime_ns, st.st_size, st.st_ino


class JwtKeys:
    """JWTs verified against the public keys of a JWKS, from a file (read at start) or a
    URL (the identity provider's `jwks_uri`: fetched at start, and again when a token
    names an unknown `kid`, at most once per JWKS_REFETCH seconds, so a stream of forged
    `kid`s cannot turn into a stream of fetches). A fetch blocks the caller for at most
    JWKS_TIMEOUT seconds; a failed one keeps the keys there are."""

    def __init__(self, source: str, audience: str, issuer: str = ""):
        import jwt  # the server extra

        self.jwt = jwt
        self.source, self.audience, self.issuer = source, audience, issuer
        self.keys: dict = {}
        self._fetched = float("-inf")
        self._fetching = False
        self._mtime = None if is_url(source) else _stamp(os.stat(source))
        self._load()
        if not self.keys:
            raise ValueError(f"{source}: no usable key in the JWKS")

    def _load(self) -> None:
        self._fetched = time.monotonic()
        try:
            if is_url(self.source):
                import urllib.request

                with urllib.request.urlopen(self.source, timeout=JWKS_TIMEOUT) as r:  # noqa: S310 - http(s) only
                    text = r.read().decode()
            else:
                text = Path(self.source).read_text()
            self.keys = {k.key_id: k for k in self.jwt.PyJWKSet.from_json(text).keys}
        except (OSError, ValueError, self.jwt.PyJWTError) as e:
            if not self.keys:
                raise ValueError(f"{self.source}: not a JWKS ({type(e).__name__}: {e})") from None
            log.warning("JWKS not refreshed from %s: %s (keeping %d keys)", self.source, e, len(self.keys))

    def refresh(self) -> None:
        """A JWKS file read again when it changed (a removed key stops verifying at once);
        a URL fetched again at most once per JWKS_REFETCH seconds, off the event loop."""
        if is_url(self.source):
            if time.monotonic() - self._fetched >= JWKS_REFETCH and not self._fetching:
                self._fetching = True
                import threading

                def fetch() -> None:
                    try:
                        self._load()
                    finally:
                        self._fetching = False
                threading.Thread(target=fetch, name="jwks-refresh", daemon=True).start()
            return
        try:
            mtime = _stamp(os.stat(self.source))
        except OSError:
            return
        if mtime != self._mtime:
            self._mtime = mtime
            self._load()

    def identify(self, token: str) -> Identity:
        jwt = self.jwt
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            if kid not in self.keys and is_url(self.source) and time.monotonic() - self._fetched >= JWKS_REFETCH:
                self._load()  # the provider may have rotated its keys
            key = self.keys.get(kid)
            if key is None:
                raise Unauthenticated(f"invalid token: signed by an unknown key (kid {kid!r})")
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name], audience=self.audience,
                                issuer=self.issuer or None, options={"require": ["exp", "sub"]})
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"invalid token: {e}") from None
        groups = claims.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise Unauthenticated("invalid token: the groups claim must be a list of strings")
        return Identity(str(claims["sub"]), frozenset(groups), claims.get("echelon_member") is True)


def write_tokens_file(path: Path, clients: Mapping[str, list[str]]) -> dict[str, str]:
    """A fresh tokens file: one random token per client name (with its groups) and one
    member token named `cluster`; returns name -> token. Mode 0600: it holds secrets."""
    import secrets

    tokens = {name: secrets.token_urlsafe(24) for name in (*clients, "cluster")}
    rows = [{"token": tokens[n], "name": n, "groups": list(g)} for n, g in clients.items()]
    rows.append({"token": tokens["cluster"], "name": "cluster", "member": True})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"tokens": rows}, f, indent=2)
    return tokens
