"""The chart's containers run as real processes: the commands and arguments the real Helm
engine renders (minimal scenario: one membership replica, one matcher, one agent) are
started with `python -m echelon`, the chart's `helm test` script publishes and receives
through the agent, and SIGTERM ends every process within its terminationGracePeriodSeconds.
Three times: in plain text; with TLS from Secrets (`tls.source: secrets`), each
component's Secret holding a component-wide certificate from a throw-away CA, where the
probes reach the plain-text health port and every service port is mTLS; and with static
tokens (`ci/auth-values.yaml`): the tokens file, the member and admin tokens from Secrets,
where a call without a token is refused.

What is not real: Kubernetes. Cluster DNS names and the pod IP become 127.0.0.1 and each
service gets a free loopback port (values the chart takes), since this machine has no
kube-apiserver, kubelet or cluster DNS; the agent's data volume is a temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.launch.placement import free_port
from tests.deploy.chart import CHART, ci_values, objects, of_kind, service_containers

ROLES = ("membership", "matcher", "agent")


def _serving(address: str) -> bool:
    """What the kubelet's gRPC probe asks (plain text: it speaks no TLS)."""
    with grpc.insecure_channel(address) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _on_loopback(arg: str, pod: str) -> str:
    """What Kubernetes would give the process: DNS names and the pod IP as loopback."""
    for k, v in {"$(POD_NAME)": pod, "$(NODE_NAME)": pod, "$(POD_IP)": "127.0.0.1",
                 "0.0.0.0": "127.0.0.1"}.items():
        arg = arg.replace(k, v)
    return ",".join(("127.0.0.1:" + a.rsplit(":", 1)[1]) if ".svc." in a else a for a in arg.split(","))


def _secrets(tmp_path, values: dict) -> dict[str, str]:
    """Secret name -> the directory standing for it, with a component-wide certificate
    (`<role>/*`) from one throw-away CA, as `tls.source: secrets` expects."""
    from echelon.runtime.certs import Authority
    from echelon.contract.transport import ANY_MEMBER

    ca = Authority.create()
    roles = {"membership": "membership", "matcher": "matcher", "agent": "agent", "client": "client"}
    hosts = ("localhost", "127.0.0.1", "echelon-agent.pubsub.svc.cluster.local")
    return {values["tls"]["secrets"][key]: str(ca.write(tmp_path / "secrets" / key, role, ANY_MEMBER, hosts=hosts))
            for key, role in roles.items()}


def _tls_dir(template: dict, secrets: dict[str, str]) -> dict[str, str]:
    """The environment the pod's TLS volume gives: ECHELON_TLS_DIR at its Secret's files."""
    volume = next((v for v in template["spec"].get("volumes", []) if v["name"] == "tls"), None)
    return {"ECHELON_TLS_DIR": secrets[volume["secret"]["secretName"]]} if volume else {}


def _auth_secrets(tmp_path) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """What `ci/auth-values.yaml`'s Secrets stand for: the tokens file (its mount path ->
    a file here) and the Secret keys the environment takes."""
    from echelon.runtime.credentials import write_tokens_file

    tokens = write_tokens_file(tmp_path / "auth" / "tokens.json", {"admin": ["admins"]})
    return ({"/etc/echelon/auth/tokens.json": str(tmp_path / "auth" / "tokens.json")},
            {("echelon-member-token", "member-token"): tokens["cluster"], ("echelon-admin-token", "token"): tokens["admin"]})


def _secret_env(container: dict, keys: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment from Secret keys (secretKeyRef)."""
    return {e["name"]: keys[(ref["name"], ref["key"])] for e in container.get("env", [])
            if (ref := e.get("valueFrom", {}).get("secretKeyRef"))}


@pytest.mark.parametrize("tls, auth", [(False, False), (True, False), (False, True)],
                         ids=["plain", "tls-secrets", "auth-tokens"])
def test_rendered_services_serve_and_pass_the_helm_test(tmp_path, tls, auth):
    ports = {r: (free_port(), free_port(), free_port()) for r in ROLES}
    values = ci_values(CHART / "ci" / "minimal-values.yaml")
    for role, (port, metrics, health) in ports.items():
        values.setdefault(role, {}).update(port=port, metricsPort=metrics, healthPort=health, grace=1)
    values["agent"]["clientPort"] = free_port()
    secrets = {}
    if tls:
        values["tls"] = ci_values(CHART / "ci" / "tls-secrets-values.yaml")["tls"]
        secrets = _secrets(tmp_path, values)
    files, keys = {}, {}
    if auth:
        values["auth"] = ci_values(CHART / "ci" / "auth-values.yaml")["auth"]
        files, keys = _auth_secrets(tmp_path)
    objs = objects(values)
    procs: list[tuple[str, subprocess.Popen, int]] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("ECHELON_TLS_DIR", None)
    env.pop("ECHELON_TOKEN", None)
    try:
        for role in ROLES:  # membership first, as its readiness gates the others' joins
            (o, c), = [(o, c) for o, c in service_containers(objs) if c["args"][0] == role]
            args = [files.get(a, _on_loopback(a, f"{o['metadata']['name']}-0").replace("/var/lib/echelon",
                                                                                        str(tmp_path / "data")))
                    for a in c["args"]]
            assert "command" not in c  # the image's entrypoint, `echelon`
            log = open(tmp_path / f"{role}.log", "wb")
            p = subprocess.Popen([sys.executable, "-m", "echelon", *args], stdout=log, stderr=subprocess.STDOUT,
                                 env=dict(env, **_tls_dir(o["spec"]["template"], secrets), **_secret_env(c, keys)),
                                 start_new_session=True)
            procs.append((role, p, o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]))
            probe = c["readinessProbe"]["grpc"]["port"]
            assert probe == ports[role][2 if tls else 0]
            _wait(lambda: _serving(f"127.0.0.1:{probe}") or p.poll() is not None, f"{role} SERVING")
            assert p.poll() is None, (tmp_path / f"{role}.log").read_text()
            if tls:  # the service port itself refuses plain text
                assert not _serving(f"127.0.0.1:{ports[role][0]}")

        (pod,) = of_kind(objs, "Pod")
        (c,) = pod["spec"]["containers"]
        test_env = dict(env, **{e["name"]: e["value"] for e in c["env"] if "value" in e}, **_secret_env(c, keys))
        test_env.update(_tls_dir(pod, secrets))  # the mount the pod's /etc/echelon/tls stands for
        assert test_env["AGENT"] == f"echelon-agent.pubsub.svc.cluster.local:{ports['agent'][0]}"
        test_env["AGENT"] = _on_loopback(test_env["AGENT"], "")
        result = subprocess.run([sys.executable, *c["command"][1:], *c["args"]], env=test_env,
                                capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "published and received" in result.stdout
        if auth:  # the same script without the admin's token: refused before anything happens
            result = subprocess.run([sys.executable, *c["command"][1:], *c["args"]],
                                    env={k: v for k, v in test_env.items() if k != "ECHELON_TOKEN"},
                                    capture_output=True, text=True, timeout=90)
            assert result.returncode != 0 and "UNAUTHENTICATED" in result.stderr, result.stderr[-2000:]
    finally:
        for role, p, _ in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for role, p, grace in reversed(procs):
            try:
                code = p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                pytest.fail(f"{role} did not stop within terminationGracePeriodSeconds={grace}")
            assert code == 0, (role, code, (tmp_path / f"{role}.log").read_text()[-2000:])
