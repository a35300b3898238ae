"""TLS in the chart (docs/security.md): every pod that speaks gRPC mounts a
certificate at the directory its ECHELON_TLS_DIR names, the certificate names the member
id the pod runs as, and the cert-manager objects validate against typed models generated
from cert-manager's CRDs (cloudcoil-models-cert-manager).

What cannot be real here: cert-manager and its csi-driver are controllers in a cluster;
no certificate is issued. What the csi-driver would write is checked by its volume
attributes; the files themselves are runtime/certs.py's business and its own tests'.
"""

from __future__ import annotations

import copy

import pytest

from tests.deploy.chart import CHART, ci_values, expand, flag, objects, of_kind, pod_template
from tests.deploy.test_chart_render import _dropped

TLS_DIR = "/etc/echelon/tls"
CERT_MANAGER = ci_values(CHART / "ci" / "tls-values.yaml")
SECRETS = ci_values(CHART / "ci" / "tls-secrets-values.yaml")
# What each workload's container runs as, the role its certificate must name.
ROLE_OF = {"membership": "membership", "matcher": "matcher", "agent": "agent", "router": "router",
           "routing-job": "replan"}


def _with_routers(values: dict) -> dict:
    v = copy.deepcopy(values)
    v["router"] = {"enabled": True, "regions": [{"name": "zone-a"}]}
    return v


def _pods(objs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, pod template) of every workload but the helm-test pod."""
    return [(o, t) for o in objs if (t := pod_template(o)) is not None and o["kind"] != "Pod"]


def _component(workload: dict) -> str:
    c = workload["metadata"]["labels"]["app.kubernetes.io/component"]
    return "router" if c.startswith("router-") else c


@pytest.mark.parametrize("values", [CERT_MANAGER, SECRETS], ids=["certManager", "secrets"])
def test_every_grpc_container_mounts_its_certificate(values):
    objs = objects(_with_routers(values))
    pods = _pods(objs)
    assert {_component(o) for o, _ in pods} == set(ROLE_OF)
    for workload, template in pods:
        spec = template["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "tls")
        for container in spec["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert env["ECHELON_TLS_DIR"] == TLS_DIR, workload["metadata"]["name"]
            assert mounts["tls"]["mountPath"] == TLS_DIR and mounts["tls"]["readOnly"] is True
        if "csi" in volume:
            assert volume["csi"]["driver"] == "csi.cert-manager.io"
        else:
            assert volume["secret"]["secretName"] == values["tls"]["secrets"][
                "routingJob" if _component(workload) == "routing-job" else _component(workload)]


def test_the_helm_test_pod_dials_with_a_client_certificate():
    for values, key in [(CERT_MANAGER, "csi"), (SECRETS, "secret")]:
        (pod,) = of_kind(objects(values), "Pod")
        (c,) = pod["spec"]["containers"]
        (volume,) = pod["spec"]["volumes"]
        assert {e["name"]: e["value"] for e in c["env"]}["ECHELON_TLS_DIR"] == TLS_DIR
        assert c["volumeMounts"] == [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}]
        if key == "csi":
            assert volume["csi"]["volumeAttributes"]["csi.cert-manager.io/uri-sans"] == "spiffe://echelon/client/${POD_NAME}"
        else:
            assert volume["secret"]["secretName"] == values["tls"]["secrets"]["client"]
        assert 'tls=os.environ.get("ECHELON_TLS_DIR")' in c["args"][0]


def test_csi_certificates_name_the_member_id_and_role():
    """contract/transport.py refuses a member whose certificate does not name the id and
    role it claims: the URI SAN the csi-driver writes must be the pod's --id."""
    objs = objects(_with_routers(CERT_MANAGER))
    checked = set()
    for workload, template in _pods(objs):
        attrs = next(v for v in template["spec"]["volumes"] if v["name"] == "tls")["csi"]["volumeAttributes"]
        component = _component(workload)
        role = ROLE_OF[component]
        assert attrs["csi.cert-manager.io/uri-sans"] == f"spiffe://echelon/{role}/${{POD_NAME}}"
        assert "echelon" in attrs["csi.cert-manager.io/dns-names"].split(",")
        assert {"server auth", "client auth"} <= set(attrs["csi.cert-manager.io/key-usages"].split(","))
        assert attrs["csi.cert-manager.io/issuer-name"] == "echelon-ca"
        if component != "routing-job":
            args = template["spec"]["containers"][0]["args"]
            assert expand(flag(args, "--id")) == expand("$(POD_NAME)"), f"{component}: the id is not the pod name"
        checked.add(component)
    assert checked == set(ROLE_OF)


def test_agents_in_a_daemonset_keep_the_node_name_without_cert_manager():
    """The node name is the agent's id unless the csi-driver (which only knows the pod's
    name) issues its certificate."""
    for values, id_var in [({}, "$(NODE_NAME)"), (SECRETS | {"agent": {"kind": "DaemonSet"}}, "$(NODE_NAME)"),
                           (CERT_MANAGER, "$(POD_NAME)")]:
        agent = of_kind(objects(values), "DaemonSet")[0]
        assert flag(agent["spec"]["template"]["spec"]["containers"][0]["args"], "--id") == id_var


def check_cert_manager(obj: dict) -> None:
    from cloudcoil.models.cert_manager import v1

    model = getattr(v1, obj["kind"]).model_validate(obj)
    dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _dropped(obj, dumped) == [], f"{obj['kind']}: fields unknown to the CRD"


def test_the_charts_own_ca_validates_against_cert_manager_models():
    objs = objects(CERT_MANAGER)
    issuers, certificates = of_kind(objs, "Issuer"), of_kind(objs, "Certificate")
    assert len(issuers) == 2 and len(certificates) == 1
    for obj in issuers + certificates:
        check_cert_manager(obj)
    ca = certificates[0]["spec"]
    assert ca["isCA"] is True
    # The CA Issuer signs with the CA Certificate's Secret; the self-signed one signs the CA.
    ca_issuer = next(i for i in issuers if "ca" in i["spec"])
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["secretName"]
    assert ca["issuerRef"]["name"] == next(i for i in issuers if "selfSigned" in i["spec"])["metadata"]["name"]


def test_cert_manager_check_can_fail():
    from pydantic import ValidationError

    cert = copy.deepcopy(of_kind(objects(CERT_MANAGER), "Certificate")[0])
    cert["spec"]["privateKey"]["algorithm"] = "DSA"
    with pytest.raises(ValidationError):
        check_cert_manager(cert)
    cert = copy.deepcopy(of_kind(objects(CERT_MANAGER), "Certificate")[0])
    cert["spec"]["isCa"] = True
    with pytest.raises(AssertionError, match="unknown to the CRD"):
        check_cert_manager(cert)


def test_an_existing_issuer_replaces_the_charts_ca():
    values = copy.deepcopy(CERT_MANAGER)
    values["tls"]["certManager"] = {"issuerRef": {"name": "corp-pki", "kind": "ClusterIssuer"}}
    objs = objects(values)
    assert not of_kind(objs, "Issuer", "Certificate")
    attrs = next(v for v in _pods(objs)[0][1]["spec"]["volumes"] if v["name"] == "tls")["csi"]["volumeAttributes"]
    assert attrs["csi.cert-manager.io/issuer-name"] == "corp-pki"
    assert attrs["csi.cert-manager.io/issuer-kind"] == "ClusterIssuer"


def test_tls_off_mounts_nothing():
    for _, template in _pods(objects({})):
        assert all(v["name"] != "tls" for v in template["spec"]["volumes"])
        for container in template["spec"]["containers"]:
            assert all(e["name"] != "ECHELON_TLS_DIR" for e in container.get("env", []))


def test_a_missing_secret_is_refused_by_name():
    from tests.deploy.chart import render

    values = copy.deepcopy(SECRETS)
    values["tls"]["secrets"]["matcher"] = ""
    with pytest.raises(Exception, match="tls.secrets.matcher"):
        render(values)
