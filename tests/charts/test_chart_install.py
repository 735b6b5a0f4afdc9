"""``helm install`` for real into a real kube-apiserver with Knative's CRDs.

The API server (1.20.2, RBAC on, no nodes, no controllers) accepts or rejects
every object the chart renders; the gateway's ServiceAccount is checked with
``kubectl auth can-i`` and by running the knative backend with its own token;
``helm upgrade`` with new function sizes changes the Knative Services;
``helm uninstall`` leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gnn_faas.config import KnativeSettings
from gnn_faas.errors import NotFound
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.knative import KnativePlatform
from gnn_faas.scheduler.platform.replica_slots import PlatformAPIError
from tests.kube import CHART, Cluster, cluster

pytestmark = pytest.mark.slow
NS, RELEASE = "gnn", "rel"
SA = f"system:serviceaccount:{NS}:{RELEASE}-gnn-faas-gateway"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


@pytest.fixture(scope="module")
def installed() -> Cluster:
    c = cluster()
    c.kubectl("create", "namespace", NS)
    c.kubectl("create", "namespace", "elsewhere")
    r = c.helm("install", RELEASE, str(CHART), "-n", NS, "--set", "gateway.ingress.enabled=true")
    assert "STATUS: deployed" in r.stdout, r.stdout
    return c


def manifest_objects(c: Cluster) -> list[dict]:
    out = c.helm("get", "manifest", RELEASE, "-n", NS).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_every_object_is_accepted(installed):
    c = installed
    objs = manifest_objects(c)
    assert len(objs) >= 10
    for o in objs:
        kind = o["kind"] if o["apiVersion"] != "serving.knative.dev/v1" else "ksvc"
        got = c.get_json(kind, o["metadata"]["name"], "-n", NS)
        assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_kubectl_get_ksvc_lists_the_functions(installed):
    out = installed.kubectl("get", "ksvc", "-n", NS, "-l", SELECTOR, "-o", "name").stdout.split()
    assert sorted(out) == [
        f"service.serving.knative.dev/{RELEASE}-gnn-faas-bitcoin-otc-compute",
        f"service.serving.knative.dev/{RELEASE}-gnn-faas-bitcoin-otc-memory",
    ]
    # the operator's inspection command from NOTES.txt runs as written
    r = installed.kubectl("get", "ksvc,revision,podautoscaler,pods", "-n", NS, "-l", SELECTOR)
    assert "bitcoin-otc-memory" in r.stdout


@pytest.mark.parametrize(
    "verb, resource, ns, allowed",
    [
        # exactly the backend's calls
        ("list", "services.serving.knative.dev", NS, True),
        ("get", "podautoscalers.autoscaling.internal.knative.dev", NS, True),
        ("list", "pods", NS, True),
        # and not even the neighbouring verbs
        ("get", "services.serving.knative.dev", NS, False),
        ("list", "podautoscalers.autoscaling.internal.knative.dev", NS, False),
        ("get", "pods", NS, False),
        # nothing else: no writes, no secrets, no other namespace
        ("get", "secrets", NS, False),
        ("list", "secrets", NS, False),
        ("list", "pods", "elsewhere", False),
        ("list", "services.serving.knative.dev", "elsewhere", False),
        ("delete", "deployments", NS, False),
        ("create", "services.serving.knative.dev", NS, False),
        ("patch", "services.serving.knative.dev", NS, False),
        ("delete", "pods", NS, False),
        ("watch", "pods", NS, False),
        ("list", "revisions.serving.knative.dev", NS, False),
        ("get", "configmaps", NS, False),
        ("get", "secrets", "openfaas", False),
    ],
)
def test_gateway_service_account_can_exactly(installed, verb, resource, ns, allowed):
    r = installed.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", SA, check=False)
    assert r.stdout.strip() == ("yes" if allowed else "no"), (verb, resource, ns, r.stdout)


FUNCTION_SA = f"system:serviceaccount:{NS}:{RELEASE}-gnn-faas-function"


@pytest.mark.parametrize(
    "verb, resource",
    [
        ("get", "secrets"),
        ("list", "secrets"),
        ("list", "pods"),
        ("get", "configmaps"),
        ("list", "services.serving.knative.dev"),
        ("get", "podautoscalers.autoscaling.internal.knative.dev"),
        ("create", "pods"),
        ("create", "serviceaccounts/token"),
        ("list", "namespaces"),
        ("*", "*"),
    ],
)
def test_function_service_account_can_do_nothing(installed, verb, resource):
    for ns in (NS, "elsewhere"):
        r = installed.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", FUNCTION_SA,
                              check=False)  # fmt: skip
        assert r.stdout.strip() == "no", (verb, resource, ns, r.stdout)


def test_function_pods_get_no_token(installed):
    c = installed
    sa = c.get_json("serviceaccount", f"{RELEASE}-gnn-faas-function", "-n", NS)
    assert sa["automountServiceAccountToken"] is False
    for kind in ("memory", "compute"):
        ksvc = c.get_json("ksvc", f"{RELEASE}-gnn-faas-bitcoin-otc-{kind}", "-n", NS)
        spec = ksvc["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == sa["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        assert "initContainers" not in spec  # stock Knative's webhook would reject them
    # the gateway's Role is bound to the gateway's account alone
    rb = c.get_json("rolebinding", f"{RELEASE}-gnn-faas-gateway", "-n", NS)
    assert [s["name"] for s in rb["subjects"]] == [f"{RELEASE}-gnn-faas-gateway"]


def test_network_policy_is_accepted_and_selects_the_function_pods(installed):
    np_ = installed.get_json("networkpolicy", f"{RELEASE}-gnn-faas-functions", "-n", NS)
    assert np_["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": RELEASE}
    gw = np_["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert gw["app.kubernetes.io/component"] == "gateway"


def sa_kubeconfig(c: Cluster, tmp_path, ns: str = NS, sa: str = f"{RELEASE}-gnn-faas-gateway"):
    """A kubeconfig holding the ServiceAccount's own token (TokenRequest)."""
    token = c.kubectl("create", "token", sa, "-n", ns).stdout.strip()
    cfg = yaml.safe_load(Path(c.kubeconfig).read_text())
    cfg["users"][0]["user"] = {"token": token}
    cfg["contexts"][0]["context"]["namespace"] = ns
    path = tmp_path / "sa-kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_backend_runs_with_the_gateway_token_and_nothing_more(installed, tmp_path):
    kubeconfig = sa_kubeconfig(installed, tmp_path)
    spec = FunctionSpec("bitcoin-otc-memory", "memory", (), 512)
    p = KnativePlatform(settings=KnativeSettings(NS, SELECTOR, kubeconfig, start_timeout_s=1))
    view = p.observe(spec)  # lists Services with the Role's grant
    assert view.resource == f"ksvc/{RELEASE}-gnn-faas-bitcoin-otc-memory"
    assert view.concurrency == 1 and view.memory_mb == 512 and view.vcpus == 1
    with pytest.raises(NotFound, match=f"no Knative Service in namespace {NS} with labels"):
        p.observe(FunctionSpec("nope-memory", "memory", (), 512))
    p.shutdown()
    # the same token in another namespace is forbidden: a clear error, named
    other = KnativePlatform(
        settings=KnativeSettings("elsewhere", SELECTOR, kubeconfig, start_timeout_s=0.5)
    )
    with pytest.raises(PlatformAPIError, match=r"forbids .* list services.serving.knative.dev"):
        other.observe(spec)
    other.refresh(spec)  # as the gateway does: the error is kept for status
    assert "(403)" in other.replicas(spec.name)["error"]
    other.shutdown()


def test_upgrade_with_new_sizes_changes_the_services(installed, tmp_path):
    c = installed
    name = f"{RELEASE}-gnn-faas-bitcoin-otc-compute"
    before = c.get_json("ksvc", name, "-n", NS)
    sizing = tmp_path / "sizing.yaml"
    sizing.write_text(
        yaml.safe_dump(
            {
                "sizing": {"bitcoin-otc": {"compute": {"cpu": "1500m", "memoryMb": 1536}}},
                "functions": {"compute": {"autoscaling": {"maxScale": 8}}},
            }
        )
    )
    c.helm("upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values", "-f", str(sizing))
    after = c.get_json("ksvc", name, "-n", NS)
    res = after["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "1500m", "memory": "1536Mi"}
    assert res == {"requests": res["limits"], "limits": res["limits"]}
    ann = after["spec"]["template"]["metadata"]["annotations"]
    assert ann["autoscaling.knative.dev/max-scale"] == "8"
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    # the gateway's serving config follows (dispatch slots = max-scale x concurrency)
    cm = c.get_json("configmap", f"{RELEASE}-gnn-faas-gateway", "-n", NS)
    assert "max_compute_instances: 8" in cm["data"]["serving.yaml"]
    memory = c.get_json("ksvc", f"{RELEASE}-gnn-faas-bitcoin-otc-memory", "-n", NS)
    assert memory["metadata"]["generation"] == 1  # untouched


def test_uninstall_leaves_nothing(installed):
    c = installed
    kinds = (
        "ksvc,deployments,services,configmaps,serviceaccounts,roles,rolebindings,"
        "poddisruptionbudgets,ingresses,jobs,networkpolicies"
    )
    assert json.loads(c.kubectl("get", kinds, "-n", NS, "-l", SELECTOR, "-o", "json").stdout)[
        "items"
    ]
    c.helm("uninstall", RELEASE, "-n", NS)
    left = json.loads(c.kubectl("get", kinds, "-n", NS, "-l", SELECTOR, "-o", "json").stdout)
    assert left["items"] == []
    # nor anything unlabelled from the release (helm's own release Secrets are gone too)
    secrets = c.get_json("secrets", "-n", NS)["items"]
    assert [s["metadata"]["name"] for s in secrets if "helm" in s["metadata"]["name"]] == []
