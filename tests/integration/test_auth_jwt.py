"""JWT client identity on real servers (runtime/auth.py): tokens signed with generated RSA
and EC keys (PyJWT, cryptography), verified against a real JWKS (a file, and a URL served
on loopback); every way a token can be wrong is UNAUTHENTICATED; and the issue's example:
a client allowed to publish on `quotes` but not subscribe gets PERMISSION_DENIED on
subscribe, naming the topic and the right, with no state changed anywhere."""

from __future__ import annotations

import http.server
import json
import threading
import time

import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from echelon.client import errors
from echelon.runtime import credentials
from echelon.runtime.auth import AuthConfig
from echelon.runtime.credentials import write_tokens_file
from tests.harness import Cluster, wait_for

SCHEMA = ["Symbol:string", "Price:float:0:1000"]
ISSUER = "https://idp.example"


class Keys:
    """Signing keys of an identity provider and the JWKS it publishes."""

    def __init__(self):
        self.private = {"rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
                        "ec-1": ec.generate_private_key(ec.SECP256R1())}

    def jwks(self, *kids: str) -> str:
        keys = []
        for kid in kids or self.private:
            key = self.private[kid]
            algorithm = jwt.algorithms.RSAAlgorithm if kid.startswith("rsa") else jwt.algorithms.ECAlgorithm
            jwk = json.loads(algorithm.to_jwk(key.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256" if kid.startswith("rsa") else "ES256"})
        return json.dumps({"keys": keys})

    def token(self, sub: str, kid: str = "rsa-1", key=None, **claims) -> str:
        body = {"sub": sub, "aud": "echelon", "iss": ISSUER, "exp": int(time.time()) + 300, **claims}
        return jwt.encode(body, key or self.private[kid], algorithm="RS256" if kid.startswith("rsa") else "ES256",
                          headers={"kid": kid})


@pytest.fixture(scope="module")
def keys():
    return Keys()


async def start(tmp_path, jwks: str) -> tuple[Cluster, dict]:
    # The members authenticate with a static token (taken in jwt mode too); clients with JWTs.
    members = write_tokens_file(tmp_path / "members.json", {})
    config = AuthConfig(mode="jwt", jwks=jwks, issuer=ISSUER, tokens_file=str(tmp_path / "members.json"),
                        member_token=members["cluster"])
    return await Cluster(agents=2, auth=config).start(), members


@pytest_asyncio.fixture
async def cluster(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_text(keys.jwks())
    c, _ = await start(tmp_path, str(path))
    try:
        yield c
    finally:
        await c.stop()


async def test_valid_tokens_pass_and_every_bad_one_is_unauthenticated(cluster, keys):
    c = cluster
    for kid in ("rsa-1", "ec-1"):
        assert await c.client(0, keys.token("root", kid, groups=["admins"])).list_topics() == []
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = {
        "expired": keys.token("root", exp=int(time.time()) - 60, groups=["admins"]),
        "wrong issuer": keys.token("root", iss="https://evil.example", groups=["admins"]),
        "wrong audience": keys.token("root", aud="someone-else", groups=["admins"]),
        "wrong key": keys.token("root", "rsa-1", key=other, groups=["admins"]),  # the kid of a trusted key
        "unknown kid": jwt.encode({"sub": "root", "aud": "echelon", "iss": ISSUER, "exp": int(time.time()) + 60},
                                  other, algorithm="RS256", headers={"kid": "rsa-9"}),
        "no exp": jwt.encode({"sub": "root", "aud": "echelon", "iss": ISSUER}, keys.private["rsa-1"],
                             algorithm="RS256", headers={"kid": "rsa-1"}),
        "alg none": jwt.encode({"sub": "root", "aud": "echelon", "iss": ISSUER, "exp": int(time.time()) + 60},
                               None, algorithm="none", headers={"kid": "rsa-1"}),
        "not a jwt": "opaque-token",
    }
    for why, token in bad.items():
        with pytest.raises(errors.Unauthenticated) as e:
            await c.client(0, token).create_topic("quotes", SCHEMA)
        assert "invalid token" in str(e.value) or "unknown token" in str(e.value), (why, str(e.value))
    assert c.membership_nodes[0].replica.topics.live() == {}  # nothing was created


async def test_publish_on_quotes_but_not_subscribe(cluster, keys):
    """The issue's example, with a JWT identity and a group rule."""
    c = cluster
    root = c.client(0, keys.token("root", groups=["admins"]))
    await root.create_topic("quotes", SCHEMA)
    await root.grant_acl("group:feeds", "quotes", ["publish"])
    await wait_for(lambda: all(a.membership.acls for a in c.agent_nodes), what="the rule reaches the agents")
    feed = c.client(1, keys.token("feed-7", "ec-1", groups=["feeds"]))
    async with root.subscribe("quotes") as watcher:
        async with feed.publisher() as pub:
            await pub.publish("quotes", {"Symbol": "aapl", "Price": 1.0})
        assert (await watcher.next(timeout=10)).attributes["Symbol"] == "aapl"
    agent = c.agent_nodes[1]
    before = (dict(agent.subscriptions.subs), [m.replica.log.version for m in c.membership_nodes])
    with pytest.raises(errors.PermissionDenied) as denied:
        async with feed.subscribe("quotes", name="feed-sub"):
            pass
    assert str(denied.value).endswith("user:feed-7 lacks the 'subscribe' right on topic 'quotes'")
    # No state changed: no subscription on the agent (named or not), none counted, no view change.
    assert (dict(agent.subscriptions.subs), [m.replica.log.version for m in c.membership_nodes]) == before
    assert agent.server.access.quotas.subscriptions == {}
    with pytest.raises(errors.PermissionDenied, match="'admin' right on every topic"):
        await feed.grant_acl("group:feeds", "quotes", ["subscribe"])
    assert [(r.principal, r.pattern, list(r.rights)) for r in await root.list_acls()] == \
        [("group:feeds", "quotes", ["publish"])]


async def test_a_jwks_url_is_fetched_again_for_a_new_key(tmp_path, keys, monkeypatch):
    """The identity provider's jwks_uri served on loopback: a key added after start is
    taken once a token names it (the refetch interval set to 0 for the test)."""
    served = {"body": keys.jwks("rsa-1")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = served["body"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(credentials, "JWKS_REFETCH", 0.0)
    c = None
    try:
        c, _ = await start(tmp_path, f"http://127.0.0.1:{server.server_port}/jwks.json")
        ec_token = keys.token("root", "ec-1", groups=["admins"])
        with pytest.raises(errors.Unauthenticated, match="unknown key"):
            await c.client(0, ec_token).list_topics()
        served["body"] = keys.jwks("rsa-1", "ec-1")  # the provider publishes its new key
        assert await c.client(0, ec_token).list_topics() == []
    finally:
        if c is not None:
            await c.stop()
        server.shutdown()
        thread.join(5)
