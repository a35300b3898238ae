"""Access control in the chart (docs/security.md; services/echelon/runtime/auth.py): `auth.*` values
rendered by the real Helm engine into the services' flags, the tokens Secret mounted, the
member and client tokens from Secrets in the environment (never in argv); the flags parse
with the services' own CLI; a values file that cannot work is refused at render time.
The rendered services running with these flags: test_chart_processes.py (auth-tokens)."""

from __future__ import annotations

import copy

import click
import pytest

from echelon.cli.main import cli
from tests.deploy.chart import CHART, ci_values, objects, of_kind, pod_template, render, service_containers

AUTH = ci_values(CHART / "ci" / "auth-values.yaml")
TLS = ci_values(CHART / "ci" / "tls-values.yaml")
JWT = {**TLS, "auth": {"mode": "jwt", "jwt": {"jwksUrl": "https://idp.example/.well-known/jwks.json",
                                              "issuer": "https://idp.example"}, "superusers": ["ops"]}}


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _parse(args: list[str]) -> dict:
    """The services' own click command parses the rendered arguments (nothing runs)."""
    command = cli.commands[args[0]]
    with click.Context(command) as ctx:
        return command.make_context(args[0], list(args[1:]), parent=ctx).params


def test_tokens_mode_renders_flags_mounts_and_secret_env():
    objs = objects(AUTH)
    containers = service_containers(objs)
    assert {c["args"][0] for _, c in containers} == {"membership", "matcher", "agent"}
    for workload, c in containers:
        params = _parse(c["args"])
        assert (params["auth"], params["tokens_file"], params["limits"]) == \
            ("tokens", "/etc/echelon/auth/tokens.json", "publish_rate=5000,subscriptions=1000")
        assert _env(c)["ECHELON_MEMBER_TOKEN"]["valueFrom"] == \
            {"secretKeyRef": {"name": "echelon-member-token", "key": "member-token"}}
        assert {"name": "auth", "mountPath": "/etc/echelon/auth", "readOnly": True} in c["volumeMounts"]
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["auth"]["secret"]["secretName"] == "echelon-tokens"
    # The admin's token for the routing job and the test pod; no secret value anywhere in argv.
    for obj in of_kind(objs, "CronJob", "Pod"):
        (c,) = pod_template(obj)["spec"]["containers"]
        assert _env(c)["ECHELON_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "echelon-admin-token", "key": "token"}
    assert not [c for _, c in containers if "--member-token" in c["args"]]


def test_jwt_with_tls_renders_the_key_set_and_makes_the_test_pod_a_superuser():
    objs = objects(JWT)
    for _, c in service_containers(objs):
        params = _parse(c["args"])
        assert (params["auth"], params["jwks"], params["jwt_issuer"], params["jwt_audience"]) == \
            ("jwt", "https://idp.example/.well-known/jwks.json", "https://idp.example", "echelon")
        # A certificate wins over a token: the test pod's certificate user must be an admin.
        assert params["superusers"] == "ops,echelon-test"
        assert "ECHELON_MEMBER_TOKEN" not in _env(c) and params["tokens_file"] is None
    (pod,) = of_kind(objs, "Pod")
    assert pod["metadata"]["name"] == "echelon-test"


def test_caps_per_identity_reach_every_service_as_json_the_services_parse():
    from echelon.runtime.limits import parse_identity_caps

    values = copy.deepcopy(AUTH)
    values["auth"]["identityCaps"] = {"user:ann": {"durable_subscriptions": 20, "durable_max_messages": 1000000},
                                      "*": {"subscriptions": 100}}
    for _, c in service_containers(objects(values)):
        assert parse_identity_caps(_parse(c["args"])["identity_caps"]) == \
            {"user:ann": {"durable_subscriptions": 20, "durable_max_messages": 1000000}, "*": {"subscriptions": 100}}
    for _, c in service_containers(objects(AUTH)):
        assert _parse(c["args"])["identity_caps"] == ""


def test_no_auth_by_default():
    for _, c in service_containers(objects()):
        assert _parse(c["args"])["auth"] == "none" and "ECHELON_MEMBER_TOKEN" not in _env(c)


@pytest.mark.parametrize("change, message", [
    (lambda v: v["auth"].pop("tokensSecret"), "auth.mode tokens needs auth.tokensSecret"),
    (lambda v: v["auth"].pop("memberToken"), "auth without tls needs auth.memberToken.secretName"),
    (lambda v: v["auth"].update(mode="jwt", tokensSecret=""), "auth.jwt.jwksUrl"),
    (lambda v: v["auth"].update(mode="ldap"), "mode"),
    (lambda v: v["auth"].update(limits="publish_rate=fast"), "limits"),
    (lambda v: v["auth"].update(identityCaps={"ann": {"subscriptions": 1}}), "propertyName .ann."),
    (lambda v: v["auth"].update(identityCaps={"user:ann": {"subscription": 1}}), "subscription"),
])
def test_values_that_cannot_work_are_refused(change, message):
    values = copy.deepcopy(AUTH)
    change(values)
    with pytest.raises(Exception, match=message):
        render(values)
