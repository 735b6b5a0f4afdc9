"""The chart with ``platform: openfaas`` installed into a real kube-apiserver.

OpenFaaS keeps its gateway's ``basic-auth`` Secret in its own namespace. The
chart gives the gnn-faas gateway a Role there for that one Secret; the test
proves with ``kubectl auth can-i`` that it may read it and nothing else, then
runs the openfaas backend with the gateway's own token: it reads the
credentials through the API and is let in by an in-test OpenFaaS gateway that
checks them. The Function CRD is a minimal one (the operator's is not needed:
no operator runs).
"""

from __future__ import annotations

import json

import pytest
import requests

from gnn_faas.config import OpenFaaSSettings
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.kube_client import read_basic_auth
from gnn_faas.scheduler.platform.openfaas import OpenFaaSPlatform
from gnn_faas.scheduler.platform.replica_slots import PlatformAPIError
from tests.charts.test_chart_install import sa_kubeconfig
from tests.kube import CHART, Cluster, cluster
from tests.scheduler.test_openfaas_platform import FakeOpenFaaS, serve

pytestmark = pytest.mark.slow
NS, FN_NS, RELEASE = "gnn-of", "openfaas-fn", "of"
USER, PASSWORD = "admin", "from-the-secret"
SA = f"system:serviceaccount:{NS}:{RELEASE}-gnn-faas-gateway"

FUNCTION_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "functions.openfaas.com"},
    "spec": {
        "group": "openfaas.com",
        "names": {"kind": "Function", "plural": "functions", "singular": "function"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def installed() -> Cluster:
    c = cluster()
    c.kubectl("apply", "-f", "-", input=json.dumps(FUNCTION_CRD))
    c.kubectl("wait", "--for", "condition=established", "crd/functions.openfaas.com")
    for ns in (NS, FN_NS, "openfaas"):
        c.kubectl("create", "namespace", ns)
    c.kubectl("-n", "openfaas", "create", "secret", "generic", "basic-auth",
              f"--from-literal=basic-auth-user={USER}",
              f"--from-literal=basic-auth-password={PASSWORD}")  # fmt: skip
    c.kubectl("-n", "openfaas", "create", "secret", "generic", "other", "--from-literal=k=v")
    r = c.helm("install", RELEASE, str(CHART), "-n", NS, "--set", "platform=openfaas",
               "--set", f"openfaas.functionNamespace={FN_NS}", "--set", "store.type=redis")  # fmt: skip
    assert "STATUS: deployed" in r.stdout, r.stdout
    return c


@pytest.mark.parametrize(
    "verb, resource, ns, allowed",
    [
        ("get", "secrets/basic-auth", "openfaas", True),
        ("get", "secrets/other", "openfaas", False),
        ("list", "secrets", "openfaas", False),
        ("watch", "secrets", "openfaas", False),
        ("update", "secrets/basic-auth", "openfaas", False),
        ("get", "secrets", NS, False),
        ("list", "functions.openfaas.com", FN_NS, False),
        ("list", "pods", NS, False),
    ],
)
def test_gateway_may_read_the_basic_auth_secret_and_nothing_else(
    installed, verb, resource, ns, allowed
):
    r = installed.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", SA, check=False)
    assert r.stdout.strip() == ("yes" if allowed else "no"), (verb, resource, ns, r.stdout)


def test_functions_and_their_account_live_in_the_function_namespace(installed):
    c = installed
    fns = c.get_json("functions.openfaas.com", "-n", FN_NS)["items"]
    assert sorted(f["metadata"]["name"] for f in fns) == [
        f"{RELEASE}-gnn-faas-bitcoin-otc-compute", f"{RELEASE}-gnn-faas-bitcoin-otc-memory"]  # fmt: skip
    for f in fns:
        assert (
            f["spec"]["annotations"]["com.openfaas.serviceaccount"]
            == f"{RELEASE}-gnn-faas-function"
        )
        # the Redis URL comes from the Secret's file, never an empty variable
        assert f["spec"]["environment"]["GNN_FAAS_STORE_FILE"] == "/var/openfaas/secrets/url"
        assert "GNN_FAAS_STORE" not in f["spec"]["environment"]
    sa = c.get_json("serviceaccount", f"{RELEASE}-gnn-faas-function", "-n", FN_NS)
    assert sa["automountServiceAccountToken"] is False
    np_ = c.get_json("networkpolicy", f"{RELEASE}-gnn-faas-functions", "-n", FN_NS)
    peers = np_["spec"]["ingress"][0]["from"]
    assert peers[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NS}
    assert peers[1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "openfaas"
    }


def test_backend_reads_the_credentials_with_the_gateway_token(installed, tmp_path, monkeypatch):
    kubeconfig = sa_kubeconfig(installed, tmp_path, ns=NS, sa=f"{RELEASE}-gnn-faas-gateway")
    monkeypatch.delenv("OPENFAAS_USER", raising=False)
    monkeypatch.delenv("OPENFAAS_PASSWORD", raising=False)
    assert read_basic_auth("openfaas/basic-auth", "basic-auth-user", "basic-auth-password",
                           kubeconfig) == (USER, PASSWORD)  # fmt: skip
    with pytest.raises(
        PlatformAPIError, match="forbids .* read the OpenFaaS basic-auth Secret openfaas/other"
    ):
        read_basic_auth("openfaas/other", "k", "k", kubeconfig)
    fake = FakeOpenFaaS()
    fake.namespace = FN_NS
    fake.add(f"{RELEASE}-gnn-faas-bitcoin-otc-memory",
             {"app.kubernetes.io/instance": RELEASE, "gnn-faas.io/function": "bitcoin-otc-memory"}, 0)  # fmt: skip
    import tests.scheduler.test_openfaas_platform as fake_module

    monkeypatch.setattr(fake_module, "USER", USER)
    monkeypatch.setattr(fake_module, "PASSWORD", PASSWORD)
    with serve(fake) as url:
        settings = OpenFaaSSettings(
            url=url, namespace=FN_NS, selector=f"app.kubernetes.io/instance={RELEASE}",
            credentials_secret="openfaas/basic-auth", kubeconfig=kubeconfig,
            refresh_s=0.0, start_timeout_s=2,
        )  # fmt: skip
        p = OpenFaaSPlatform(settings=settings, reaper_interval_s=None)
        inst = p.launch(FunctionSpec("bitcoin-otc-memory", "memory", (), 512))  # woken from zero
        assert fake.scale_calls == [(f"{RELEASE}-gnn-faas-bitcoin-otc-memory", 1)]
        assert inst.url == f"{url}/function/{RELEASE}-gnn-faas-bitcoin-otc-memory.{FN_NS}"
        with p.busy(inst.id):
            assert requests.post(f"{inst.url}/echo", timeout=5).status_code == 200
        assert fake.system_namespaces == {FN_NS}
        p.shutdown()
