"""The Helm chart rendered by real Helm: lint, schema, and every object validated.

Core objects validate with ``kubernetes-validate --strict`` for Kubernetes
1.35; Knative Services against Knative's own CRD schema (../shared/crds,
strict); OpenFaaS Functions against a schema written from OpenFaaS's
documented fields. Known-bad fixtures show each checker can fail.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gnn_faas.config import ServingConfig, from_dict
from tests.charts.crd_schema import crd_schema
from tests.charts.knative_rules import knative_errors
from tests.kube import CHART, helm, render

K8S_VERSION = "1.35.0"
FUNCTION_SCHEMA = json.loads(Path(__file__).with_name("openfaas_function.schema.json").read_text())
MATRIX = list(itertools.product(["knative", "openfaas"], ["s3", "redis"], [False, True]))


def values_for(platform: str, store: str, ingress: bool) -> dict:
    return {
        "platform": platform,
        "store": {"type": store},
        "gateway": {
            "replicas": 2 if ingress else 1,
            "ingress": {"enabled": ingress, "host": "gnn.example.com"},
            "serviceMonitor": {"enabled": ingress},
        },
        "prepare": {"enabled": True},
        "models": [
            {"name": "bitcoin-otc", "graph": "bitcoin-otc", "dataset": "bitcoin-otc"},
            {"name": "cora", "graph": "cora", "slo_s": 0.5, "mode": "no_sharing"},
        ],
    }


def is_knative(obj: dict) -> bool:
    return obj["apiVersion"] == "serving.knative.dev/v1" and obj["kind"] == "Service"


def is_function(obj: dict) -> bool:
    return obj["apiVersion"] == "openfaas.com/v1"


def validate(obj: dict, features: frozenset[str] = frozenset()) -> None:
    """Raise if ``obj`` fails its schema (by kind); Knative Services also the
    webhook's rules with the feature flags ``features`` on (stock: none)."""
    if is_knative(obj):
        jsonschema.validate(obj, crd_schema("knative-serving-service.yaml"))
        errors = knative_errors(obj, features)
        if errors:
            raise jsonschema.ValidationError("; ".join(errors))
    elif is_function(obj):
        jsonschema.validate(obj, FUNCTION_SCHEMA)
    elif obj["apiVersion"] == "monitoring.coreos.com/v1":
        assert set(obj["spec"]) == {"selector", "endpoints"}
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def pod_specs(obj: dict) -> list[dict]:
    if is_knative(obj):
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] in ("Deployment", "Job"):
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "Pod":
        return [obj["spec"]]
    return []


@pytest.fixture(scope="module", params=MATRIX, ids=lambda p: "-".join(map(str, p)))
def rendered(request) -> tuple[tuple, list[dict]]:
    values = values_for(*request.param)
    return request.param, render(values)


def test_lint_strict_over_the_matrix(tmp_path):
    for combo in MATRIX:
        f = tmp_path / "v.yaml"
        f.write_text(yaml.safe_dump(values_for(*combo)))
        r = helm("lint", "--strict", str(CHART), "-f", str(f))
        assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout


def test_every_object_validates(rendered):
    (platform, store, ingress), objs = rendered
    kinds = sorted({o["kind"] for o in objs})
    for obj in objs:
        validate(obj)
    functions = [o for o in objs if is_knative(o) or is_function(o)]
    assert len(functions) == 4  # 2 models x (memory, compute)
    assert all(is_knative(f) == (platform == "knative") for f in functions)
    assert ("Ingress" in kinds) == ingress == ("ServiceMonitor" in kinds)
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "NetworkPolicy"} <= set(
        kinds
    )
    # a PDB only with two gateway replicas (with one it would block every node drain)
    assert ("PodDisruptionBudget" in kinds) == ingress


def test_labels_everywhere(rendered):
    _, objs = rendered
    for obj in objs:
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)
        if is_knative(obj) or is_function(obj):
            assert labels["gnn-faas.io/model"] in ("bitcoin-otc", "cora")
            assert labels["gnn-faas.io/function-kind"] in ("memory", "compute")


def test_every_pod_is_locked_down(rendered):
    _, objs = rendered
    pods = [(o, s) for o in objs for s in pod_specs(o)]
    assert len(pods) >= 2
    for obj, spec in pods:
        psc = spec.get("securityContext")
        if psc is not None:  # Knative gates pod-level securityContext: containers carry it
            assert psc["runAsNonRoot"] is True
        containers = spec["containers"] + spec.get("initContainers", [])
        for c in containers:
            sc = c["securityContext"]
            where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][part]), where
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            # the only writable path: /tmp, or /scratch where Knative reserves /tmp
            scratch = "/scratch" if is_knative(obj) else "/tmp"
            assert not mounts[scratch].get("readOnly"), where
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if is_knative(obj):
                assert env["TMPDIR"] == env["HOME"] == "/scratch", where
                assert c["workingDir"] == "/scratch", where
    for fn in (o for o in objs if is_function(o)):
        assert fn["spec"]["readOnlyRootFilesystem"] is True
        assert set(fn["spec"]["limits"]) == set(fn["spec"]["requests"]) == {"cpu", "memory"}


def test_store_wiring(rendered):
    (platform, store, _), objs = rendered
    dep = next(o for o in objs if o["kind"] == "Deployment")
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    if store == "s3":
        assert env["GNN_FAAS_STORE"]["value"] == "s3://gnn-faas"
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "gnn-faas-s3"
    else:
        ref = env["GNN_FAAS_STORE"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "gnn-faas-redis", "key": "url"}
    if platform == "openfaas":
        # basic auth comes from OpenFaaS's own Secret in its namespace, through a Role for
        # that Secret alone (a Pod cannot mount a Secret of another namespace)
        assert not any(k.startswith("OPENFAAS_") for k in env)
        cm = next(o for o in objs if o["kind"] == "ConfigMap")
        ofaas = yaml.safe_load(cm["data"]["serving.yaml"])["platform"]["openfaas"]
        assert ofaas["credentials_secret"] == "openfaas/basic-auth"
        role = next(o for o in objs if o["kind"] == "Role")
        assert role["metadata"]["namespace"] == "openfaas"
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["basic-auth"],
             "verbs": ["get"]}
        ]  # fmt: skip
        # every function reads the store: s3 through the credentials file, redis through the
        # URL file of the Secret (never an empty GNN_FAAS_STORE)
        for fn in (o for o in objs if is_function(o)):
            fenv = fn["spec"]["environment"]
            assert fn["spec"]["secrets"] == [f"gnn-faas-{store}"]
            if store == "redis":
                assert "GNN_FAAS_STORE" not in fenv
                assert fenv["GNN_FAAS_STORE_FILE"] == "/var/openfaas/secrets/url"
            else:
                assert fenv["GNN_FAAS_STORE"] == "s3://gnn-faas"


def test_configmap_is_the_serving_config(rendered, monkeypatch):
    (platform, _, _), objs = rendered
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    monkeypatch.setenv("GNN_FAAS_STORE", "redis://redis:6379/0")
    cfg = from_dict(ServingConfig, yaml.safe_load(cm["data"]["serving.yaml"]))
    assert cfg.store == "redis://redis:6379/0"
    assert cfg.platform.kind == platform
    assert [m.name for m in cfg.models] == ["bitcoin-otc", "cora"]
    assert cfg.model("cora").mode == "no_sharing" and cfg.model("cora").slo_s == 0.5
    assert cfg.model("cora").checkpoint == "/model/cora"
    assert cfg.platform.max_memory_instances == 4  # max-scale 4 x containerConcurrency 1
    if platform == "knative":
        assert cfg.platform.knative.selector == "app.kubernetes.io/instance=gnn-faas"
    else:
        assert cfg.platform.openfaas.url == "http://gateway.openfaas:8080"


def test_updates_are_off_by_default_and_wired_to_a_secret_when_on(monkeypatch):
    def gateway(objs):
        dep = next(o for o in objs if o["kind"] == "Deployment")
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        cm = next(o for o in objs if o["kind"] == "ConfigMap")
        return env, from_dict(ServingConfig, yaml.safe_load(cm["data"]["serving.yaml"]))

    env, cfg = gateway(render(None))
    assert "GNN_FAAS_WRITE_TOKEN" not in env and cfg.graphs.token_of("bitcoin-otc") is None
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "gnn-faas-s3"
    on = {"graphs": {"writeTokenSecret": "graph-writers", "freshnessSeconds": 0.5}}
    env, cfg = gateway(render(on))
    ref = env["GNN_FAAS_WRITE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "graph-writers", "key": "token"}
    # the gateway writes the graph's log: the read-write credentials
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "gnn-faas-s3-write"
    assert cfg.graphs.freshness_s == 0.5
    assert cfg.graphs.token_of("bitcoin-otc") is None  # the variable unset: refused, not "${..}"
    monkeypatch.setenv("GNN_FAAS_WRITE_TOKEN", "tok")
    assert cfg.graphs.token_of("bitcoin-otc") == "tok"


def test_cpu_quantities_become_cores_in_the_serving_config():
    objs = render(None, "functions.memory.cpu=500m", "functions.compute.cpu=1.5")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    cfg = from_dict(ServingConfig, yaml.safe_load(cm["data"]["serving.yaml"]))
    assert (cfg.platform.memory_vcpus, cfg.platform.compute_vcpus) == (0.5, 1.5)


def test_prepare_job_steps_per_model():
    values = values_for("knative", "s3", False)
    job = next(o for o in render(values) if o["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    # cora has no dataset: its graph and checkpoint must be in the store already
    assert [c["name"] for c in spec["initContainers"]] == ["dataset-0", "train-0"]
    images = [c["image"] for c in spec["initContainers"] + spec["containers"]]
    assert images == ["ghcr.io/gnn-faas/gnn-faas-compute:0.1.0"] * 3  # one image, every step
    assert spec["containers"][0]["command"][-1] == "/tmp/models/bitcoin-otc"
    train = spec["initContainers"][1]["command"]
    assert train[3:] == ["bitcoin-otc", "bitcoin-otc", "gcn", "2", "64", "100", "bitcoin-otc"]
    assert "env" not in spec["initContainers"][1]  # no store credentials where not needed
    # the steps that write the store get the read-write Secret, nothing else does
    for c in (spec["initContainers"][0], spec["containers"][0]):
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
        assert refs == {"gnn-faas-s3-write"}
    readers = [o for o in render(values) if is_knative(o) or o["kind"] == "Deployment"]
    for o in readers:
        for c in o["spec"]["template"]["spec"]["containers"]:
            refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
            assert refs == {"gnn-faas-s3"}, o["metadata"]["name"]
    # on install only, unless asked: an upgrade does not retrain
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    values["prepare"]["onUpgrade"] = True
    job = next(o for o in render(values) if o["kind"] == "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"


def test_knative_service_settings():
    values = {
        "functions": {"keepAliveSeconds": 90, "memory": {"containerConcurrency": 3}},
        "sizing": {"bitcoin-otc": {"compute": {"cpu": "750m", "memoryMb": 700}}},
    }
    objs = render(values)
    svcs = {o["metadata"]["labels"]["gnn-faas.io/function-kind"]: o for o in objs if is_knative(o)}
    mem, comp = svcs["memory"], svcs["compute"]
    assert mem["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    ann = mem["spec"]["template"]["metadata"]["annotations"]
    assert ann["autoscaling.knative.dev/scale-to-zero-pod-retention-period"] == "90s"
    assert ann["autoscaling.knative.dev/min-scale"] == "1"
    assert ann["autoscaling.knative.dev/max-scale"] == "4"
    assert ann["autoscaling.knative.dev/metric"] == "concurrency"
    for key in ("target", "window", "initial-scale"):
        assert f"autoscaling.knative.dev/{key}" in ann
    assert mem["spec"]["template"]["spec"]["containerConcurrency"] == 3
    c = mem["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    cc = comp["spec"]["template"]["spec"]["containers"][0]
    assert cc["resources"]["requests"] == {"cpu": "750m", "memory": "700Mi"}
    assert cc["image"] == "ghcr.io/gnn-faas/gnn-faas-compute:0.1.0"
    assert cc["imagePullPolicy"] == "IfNotPresent"
    # stock Knative rejects init containers: the compute function pulls its checkpoint itself
    assert "initContainers" not in comp["spec"]["template"]["spec"]
    cmd = cc["command"]
    assert cmd[cmd.index("--model-name") + 1] == "bitcoin-otc"
    assert cmd[cmd.index("--store") + 1] == "$(GNN_FAAS_STORE)"
    assert cmd[cmd.index("--model") + 1] == "/scratch/model"
    # the init-container path stays, as an option
    comp = next(
        o
        for o in render(values, "knative.fetchModel=true")
        if is_knative(o) and o["metadata"]["name"].endswith("-compute")
    )
    init = comp["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:3] == ["gnn-faas", "model", "pull"]


def test_openfaas_function_labels():
    objs = render(None, "platform=openfaas", "functions.memory.autoscaling.minScale=0")
    fns = {o["metadata"]["labels"]["gnn-faas.io/function-kind"]: o for o in objs if is_function(o)}
    labels = fns["memory"]["spec"]["labels"]
    assert labels["com.openfaas.scale.min"] == "0"
    assert labels["com.openfaas.scale.max"] == "4"
    assert labels["com.openfaas.scale.zero"] == "true"
    assert labels["com.openfaas.scale.zero-duration"] == "10m"
    assert labels["com.openfaas.scale.type"] == "capacity"
    assert labels["gnn-faas.io/function"] == "bitcoin-otc-memory"
    assert fns["compute"]["spec"]["labels"]["com.openfaas.scale.zero"] == "false"


def test_image_registry_and_tag():
    objs = render(None, "image.registry=ghcr.io/acme/", "image.tag=1.2.3")
    images = {
        c["image"]
        for o in objs
        for s in pod_specs(o)
        for c in s["containers"] + s.get("initContainers", [])
    }
    assert images == {
        "ghcr.io/acme/gnn-faas-memory:1.2.3",
        "ghcr.io/acme/gnn-faas-compute:1.2.3",
        "ghcr.io/acme/gnn-faas-gateway:1.2.3",
    }


@pytest.mark.parametrize(
    "sets, field",
    [
        (["platform=lambda"], "'/platform'"),
        (["store.type=gcs"], "'/store/type'"),
        (["functions.memory.memoryMb=lots"], "'/functions/memory/memoryMb'"),
        (["functions.compute.autoscaling.metric=cpu"], "'/functions/compute/autoscaling/metric'"),
        (["functions.memory.containerConcurrency=0"], "'/functions/memory/containerConcurrency'"),
        (["models[0].name=Bad_Name"], "'/models/0/name'"),
        (["gateway.replicas=0"], "'/gateway/replicas'"),
        (["gateway.colour=blue"], "'colour'"),
        (["image.pullPolicy=Sometimes"], "'/image/pullPolicy'"),
        (["openfaas.gatewayUrl=gateway:8080"], "'/openfaas/gatewayUrl'"),
    ],
)
def test_schema_rejects_wrong_values_naming_the_field(sets, field):
    """Helm reports the field as a JSON pointer: ``at '/store/type': ...``."""
    args = ["template", "x", str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = helm(*args, check=False)
    assert r.returncode != 0
    assert "values don't meet the specifications of the schema" in r.stderr, r.stderr
    assert field in r.stderr, r.stderr


def test_known_bad_fixtures_are_rejected():
    objs = render(None)
    ksvc = next(o for o in objs if is_knative(o))
    bad = copy.deepcopy(ksvc)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(jsonschema.ValidationError, match="imagePullPolicyy"):
        validate(bad)
    bad = copy.deepcopy(ksvc)
    bad["spec"]["template"]["spec"]["containerConcurrency"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    # schema-valid but refused by Knative's webhook
    for mutate, message in (
        (
            lambda c: c["volumeMounts"].append({"name": "scratch", "mountPath": "/tmp/"}),
            "reserved path",
        ),
        (lambda c: c["env"].append({"name": "PORT", "value": "9090"}), "reserved variable"),
        (lambda c: c["ports"].append({"containerPort": 9090}), "single port"),
        (lambda c: c["readinessProbe"].pop("timeoutSeconds"), "timeoutSeconds"),
    ):
        bad = copy.deepcopy(ksvc)
        mutate(bad["spec"]["template"]["spec"]["containers"][0])
        with pytest.raises(jsonschema.ValidationError, match=message):
            validate(bad)

    fn = next(o for o in render(None, "platform=openfaas") if is_function(o))
    for mutate in (
        lambda f: f["spec"].pop("image"),
        lambda f: f["spec"].__setitem__("command", ["x"]),
        lambda f: f["spec"]["limits"].__setitem__("gpu", "1"),
        lambda f: f["spec"].__setitem__("readOnlyRootFilesystem", "yes"),
    ):
        bad = copy.deepcopy(fn)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)

    dep = next(o for o in objs if o["kind"] == "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnly"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def test_notes_name_the_kubectl_inspection():
    r = helm("install", "demo", str(CHART), "--dry-run=client", "--namespace", "ml")
    assert (
        "kubectl -n ml get ksvc,revision,podautoscaler,pods -l app.kubernetes.io/instance=demo"
        in r.stdout
    )
    assert "port-forward svc/demo-gnn-faas-gateway" in r.stdout


def test_reference_documents_every_value():
    """docs/reference/chart-values.md (generated from values.yaml's `# --` comments
    by scripts/gen_docs.py) has a row for every value or one of its parents."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART.parent / "docs" / "reference" / "chart-values.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))

    def leaves(v, path=()):
        if isinstance(v, dict) and v:
            for k, x in v.items():
                yield from leaves(x, (*path, k))
        else:
            yield path

    missing = [
        ".".join(p)
        for p in leaves(values)
        if not any(".".join(p[:i]) in documented for i in range(1, len(p) + 1))
    ]
    assert missing == []
    # and nothing documented that values.yaml lacks
    keys = {".".join(p[:i]) for p in leaves(values) for i in range(1, len(p) + 1)}
    assert documented <= keys, documented - keys


@pytest.mark.slow
def test_prepare_job_and_fetch_model_commands_run(tmp_path):
    """The rendered commands themselves, run here as the kubelet would (``$(VAR)``
    expanded, /tmp being the pod's emptyDir): prepare the dataset into the
    store, train on a local copy, push, then pull as the fetch-model init
    container does; the pulled checkpoint is the trained one."""
    import os
    import subprocess
    import sys

    from gnn_faas.functions.checkpoint import load_config

    values = {"prepare": {"enabled": True}, "models": [{"name": "btc", "graph": "bitcoin-otc",
              "dataset": "bitcoin-otc", "epochs": 2, "hidden": 8}]}  # fmt: skip
    objs = render(values)
    store = f"file://{tmp_path / 'store'}"
    job = next(o for o in objs if o["kind"] == "Job")["spec"]["template"]["spec"]
    compute = next(
        o
        for o in objs
        if is_knative(o) and o["metadata"]["labels"]["gnn-faas.io/function-kind"] == "compute"
    )["spec"]["template"]["spec"]
    pod_tmp = tmp_path / "pod-tmp"

    def run(command):
        argv = [a.replace("$(GNN_FAAS_STORE)", store).replace("/tmp/", f"{pod_tmp}/")
                for a in command]  # fmt: skip
        argv = [str(tmp_path / "model") if a == "/model" else a for a in argv]
        env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, (argv, r.stderr[-2000:])

    for c in job["initContainers"] + job["containers"]:
        run(c["command"])
    fetch = next(
        o
        for o in render(values, "knative.fetchModel=true")
        if is_knative(o) and o["metadata"]["labels"]["gnn-faas.io/function-kind"] == "compute"
    )["spec"]["template"]["spec"]
    run(fetch["initContainers"][0]["command"])
    # the default path: the compute function pulls the same checkpoint at start (the pull
    # itself, then a clear exit where the store lacks the model)
    serve = compute["containers"][0]["command"]
    assert "--model-name" in serve
    cfg = load_config(tmp_path / "model")
    assert cfg.hidden_dim == 8 and cfg.arch == "gcn"
    assert load_config(pod_tmp / "models" / "btc") == cfg


# -- rules that keep a render from reaching Knative's webhook (or a broken object) ---------


@pytest.mark.parametrize(
    "sets, field",
    [
        (["functions.keepAliveSeconds=3601"], "'/functions/keepAliveSeconds'"),
        (
            ["functions.memory.autoscaling.targetUtilizationPercentage=101"],
            "'/functions/memory/autoscaling/targetUtilizationPercentage'",
        ),
        (
            ["functions.compute.autoscaling.targetUtilizationPercentage=0"],
            "'/functions/compute/autoscaling/targetUtilizationPercentage'",
        ),
        (["functions.memory.autoscaling.target=0.001"], "'/functions/memory/autoscaling/target'"),
        (["functions.memory.autoscaling.window=60"], "'/functions/memory/autoscaling/window'"),
        (["knative.progressDeadline=10m"], "'/knative/progressDeadline'"),
        (["image.registry=https://registry.example.com"], "'/image/registry'"),
        (["image.tag=not a tag"], "'/image/tag'"),
        (["image.compute.digest=latest"], "'/image/compute/digest'"),
        (["image.gateway.repository=Gateway"], "'/image/gateway/repository'"),
        (["serviceAccount.create=false", "serviceAccount.name=default"], "'/serviceAccount/name'"),
        (["functions.memory.env[0].name=PORT", "functions.memory.env[0].value=1"], "'/functions/memory/env/0/name'"),
        (["functions.compute.gpus=-1"], "'/functions/compute/gpus'"),
        (["networkPolicy.knativeNamespaces[0]=Bad_NS"], "'/networkPolicy/knativeNamespaces/0'"),
        (["models[0].cachePrior=pagerank"], "'/models/0/cachePrior'"),
        (["openfaas.basicAuthNamespace=Open_FaaS"], "'/openfaas/basicAuthNamespace'"),
    ],
)  # fmt: skip
def test_schema_rejects_what_knative_would(sets, field):
    test_schema_rejects_wrong_values_naming_the_field(sets, field)


TWO_MODELS = [
    "models[0].name=a",
    "models[0].graph=g",
    "models[1].name=b",
    "models[1].graph=g",
]


@pytest.mark.parametrize(
    "sets, message",
    [
        (["models[0].name=a", "models[0].graph=g", "models[1].name=a", "models[1].graph=h"],
         'the name "a" is used twice'),
        (["sizing.nope.memory.memoryMb=256"], "sizing.nope: no model of that name"),
        (["functions.memory.autoscaling.minScale=5"], "minScale 5 > maxScale 4"),
        (["sizing.bitcoin-otc.compute.memoryMb=256", "functions.compute.autoscaling.initialScale=9",
          "functions.compute.autoscaling.maxScale=8"], "initialScale 9 > maxScale 8"),
        (["functions.compute.autoscaling.initialScale=0"], "initialScale 0 needs knative.allowZeroInitialScale"),
        (["functions.memory.autoscaling.target=1"], "target 1 must be below containerConcurrency 1"),
        (["functions.memory.containerConcurrency=2", "functions.memory.autoscaling.target=3"],
         "target 3 must be below containerConcurrency 2"),
        (["functions.memory.autoscaling.window=5s"], "window 5s is outside Knative's 6s..1h"),
        (["functions.compute.autoscaling.window=61m"], "window 61m is outside Knative's 6s..1h"),
        (["functions.compute.autoscaling.window=5000ms"], "window 5000ms is outside"),
        (["prepare.enabled=true", "store.s3.writeSecret="], "set store.s3.writeSecret"),
        (["prepare.enabled=true", "store.type=redis", "store.redis.writeSecret="],
         "set store.redis.writeSecret"),
        (["serviceAccount.create=false"], "serviceAccount.create=false needs serviceAccount.name"),
    ],
)  # fmt: skip
def test_render_time_rules_reject_with_a_message(sets, message):
    args = ["template", "x", str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = helm(*args, check=False)
    assert r.returncode != 0, r.stdout[:500]
    assert message in r.stderr, r.stderr


def test_rules_pass_their_allowed_edges():
    """The same rules let the edges through: the checks above can pass."""
    objs = render(
        None,
        "functions.memory.autoscaling.window=6s",
        "functions.compute.autoscaling.window=1h",
        "functions.keepAliveSeconds=3600",
        "functions.memory.autoscaling.minScale=4",
        "functions.compute.autoscaling.initialScale=0",
        "knative.allowZeroInitialScale=true",
        "serviceAccount.create=false",
        "serviceAccount.name=gw",
    )
    ksvcs = [o for o in objs if is_knative(o)]
    assert len(ksvcs) == 2
    for k in ksvcs:
        assert knative_errors(k, allow_zero_initial_scale=True) == []
    ann = ksvcs[1]["spec"]["template"]["metadata"]["annotations"]
    assert ann["autoscaling.knative.dev/initial-scale"] == "0"
    binding = next(o for o in objs if o["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == "gw"


def test_webhook_rules_reject_their_fixtures():
    """Each admission rule knative_rules.py mirrors fails a fixture."""
    ksvc = next(o for o in render(None) if is_knative(o))
    assert knative_errors(ksvc) == []
    key = "autoscaling.knative.dev/"
    for ann, message in (
        ({"min-scale": "5", "max-scale": "4"}, "min-scale 5 > max-scale 4"),
        ({"initial-scale": "0"}, "initial-scale 0"),
        ({"target": "0.001"}, "target 0.001"),
        ({"target-utilization-percentage": "0"}, "target-utilization-percentage 0"),
        ({"window": "5s"}, "window 5s"),
        ({"window": "2h"}, "window 2h"),
        ({"scale-to-zero-pod-retention-period": "3601s"}, "retention-period 3601s"),
    ):
        bad = copy.deepcopy(ksvc)
        bad["spec"]["template"]["metadata"]["annotations"].update(
            {key + k: v for k, v in ann.items()}
        )
        assert any(message in e for e in knative_errors(bad)), (ann, knative_errors(bad))
    for field, value in (
        ("initContainers", [{"name": "x", "image": "x"}]),
        ("nodeSelector", {"disk": "ssd"}),
        ("tolerations", [{"key": "gpu", "operator": "Exists"}]),
    ):
        bad = copy.deepcopy(ksvc)
        bad["spec"]["template"]["spec"][field] = value
        assert any("feature flag" in e for e in knative_errors(bad)), field


def test_init_container_path_needs_its_feature_flag():
    objs = render(None, "knative.fetchModel=true")
    comp = next(o for o in objs if is_knative(o) and o["metadata"]["name"].endswith("compute"))
    with pytest.raises(jsonschema.ValidationError, match="podspec-init-containers"):
        validate(comp)
    validate(comp, frozenset({"kubernetes.podspec-init-containers"}))


def test_long_names_are_shortened_with_a_hash_and_never_collide():
    model = "m" * 39
    objs = render(
        None,
        f"models[0].name={model}a",
        "models[0].graph=g",
        f"models[1].name={model[:-1]}b",
        "models[1].graph=g",
        release="a-rather-long-release-name-for-this-cluster",
    )
    names = [o["metadata"]["name"] for o in objs if is_knative(o)]
    assert len(names) == len(set(names)) == 4
    for n in names:
        assert len(n) <= 49 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n), n
        assert re.search(r"-[0-9a-f]{8}$", n), n  # shortened: 40 characters + hash
    for o in objs:
        validate(o)
    # the gateway finds them by label, not by name
    labels = sorted(o["metadata"]["labels"]["gnn-faas.io/function"] for o in objs if is_knative(o))
    assert labels == sorted(
        f"{m}-{k}" for m in (model + "a", model[:-1] + "b") for k in ("memory", "compute")
    )
    # a short name is left as it is
    short = [o["metadata"]["name"] for o in render(None) if is_knative(o)]
    assert short == ["gnn-faas-bitcoin-otc-memory", "gnn-faas-bitcoin-otc-compute"]


def test_target_utilisation_makes_the_target_literal():
    """Knative wants ceil(in-flight / (target x utilisation / 100)) replicas. With
    the chart's 100%, one replica kept full asks for exactly one more, and a replica
    with an idle slot asks for none (Knative's default 70% asked for three)."""
    import math

    objs = render(
        None, "functions.memory.containerConcurrency=4", "functions.memory.autoscaling.target=3"
    )
    for k in (o for o in objs if is_knative(o)):
        ann = k["spec"]["template"]["metadata"]["annotations"]
        cc = k["spec"]["template"]["spec"]["containerConcurrency"]
        target = float(ann["autoscaling.knative.dev/target"])
        util = float(ann["autoscaling.knative.dev/target-utilization-percentage"])
        assert util == 100
        per_replica = target * util / 100
        assert math.ceil(cc / per_replica) == 2  # one replica kept full: exactly one more
        assert math.ceil(math.floor(target) / per_replica) <= 1  # below the target: none
        assert math.ceil(1 / (0.7 * 0.7)) == 3  # what the default utilisation did


def test_function_pods_run_as_their_own_tokenless_account():
    for platform in ("knative", "openfaas"):
        objs = render(None, f"platform={platform}")
        sa = next(
            o
            for o in objs
            if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-function")
        )
        assert sa["automountServiceAccountToken"] is False
        for fn in (o for o in objs if is_knative(o)):
            spec = fn["spec"]["template"]["spec"]
            assert spec["serviceAccountName"] == sa["metadata"]["name"]
            assert spec["automountServiceAccountToken"] is False
        for fn in (o for o in objs if is_function(o)):
            assert (
                fn["spec"]["annotations"]["com.openfaas.serviceaccount"] == sa["metadata"]["name"]
            )
        bindings = [o for o in objs if o["kind"] == "RoleBinding"]
        assert [b["subjects"] for b in bindings] == [
            [{"kind": "ServiceAccount", "name": "gnn-faas-gateway", "namespace": "default"}]
        ]


def test_network_policy_admits_only_the_gateway_and_the_platform_path():
    for platform, allowed in (
        ("knative", ["knative-serving", "kourier-system", "istio-system"]),
        ("openfaas", ["openfaas"]),
    ):
        objs = render(None, f"platform={platform}")
        np_ = next(o for o in objs if o["kind"] == "NetworkPolicy")
        sel = np_["spec"]["podSelector"]
        pods = [o for o in objs if is_knative(o) or is_function(o)]
        gateway = next(o for o in objs if o["kind"] == "Deployment")

        def selects(labels, sel=sel):
            return all(labels.get(k) == v for k, v in sel["matchLabels"].items()) and all(
                labels.get(e["key"]) in e["values"] for e in sel["matchExpressions"]
            )

        for fn in pods:
            labels = (fn["spec"]["template"]["metadata"] if is_knative(fn) else fn["spec"])[
                "labels"
            ]
            assert selects(labels), fn["metadata"]["name"]
        assert not selects(gateway["spec"]["template"]["metadata"]["labels"])
        assert np_["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = np_["spec"]["ingress"]
        peers = rule["from"]
        gw = peers[0]
        assert gw["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "default"}
        gw_labels = gateway["spec"]["template"]["metadata"]["labels"]
        assert all(gw_labels[k] == v for k, v in gw["podSelector"]["matchLabels"].items())
        assert gw["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
        assert [
            p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers[1:]
        ] == allowed
        assert all("podSelector" not in p for p in peers[1:])
    assert not [
        o for o in render(None, "networkPolicy.enabled=false") if o["kind"] == "NetworkPolicy"
    ]


def test_notes_with_ingress_name_the_ingress_host():
    r = helm("install", "demo", str(CHART), "--dry-run=client", "--set", "gateway.ingress.enabled=true",
             "--set", "gateway.ingress.host=gnn.example.com", "--set", "gateway.ingress.tlsSecret=t")  # fmt: skip
    assert "export GNN_FAAS_URL=https://gnn.example.com" in r.stdout
    assert "localhost" not in r.stdout and "port-forward" not in r.stdout
    assert "helm test demo" in r.stdout


def test_memory_function_cache_follows_the_mode_and_prior():
    values = {"models": [
        {"name": "a", "graph": "g", "mode": "request_centric"},
        {"name": "b", "graph": "g", "cachePrior": "fap"},
    ]}  # fmt: skip
    for platform in ("knative", "openfaas"):
        objs = render({**values, "platform": platform})
        mem = {o["metadata"]["labels"]["gnn-faas.io/model"]: o for o in objs
               if (is_knative(o) or is_function(o)) and o["metadata"]["name"].endswith("memory")}  # fmt: skip
        if platform == "knative":
            a = mem["a"]["spec"]["template"]["spec"]["containers"][0]["command"]
            b = mem["b"]["spec"]["template"]["spec"]["containers"][0]["command"]
            assert a[a.index("--cache-max-rows") + 1] == "0"
            assert "--cache-max-rows" not in b and b[b.index("--cache-prior") + 1] == "fap"
        else:
            assert mem["a"]["spec"]["environment"]["GNN_FAAS_CACHE_MAX_ROWS"] == "0"
            assert "GNN_FAAS_CACHE_MAX_ROWS" not in mem["b"]["spec"]["environment"]
            assert mem["b"]["spec"]["environment"]["GNN_FAAS_CACHE_PRIOR"] == "fap"


def test_per_function_placement_env_and_gpus():
    values = {"functions": {"compute": {
        "nodeSelector": {"gpu": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "env": [{"name": "GNN_FAAS_THREADS", "value": "2"}], "gpus": 1}}}  # fmt: skip
    objs = render(values)
    comp = next(o for o in objs if is_knative(o) and o["metadata"]["name"].endswith("compute"))
    spec = comp["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "a100"} and spec["tolerations"][0]["key"] == "gpu"
    c = spec["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "GNN_FAAS_THREADS", "value": "2"} in c["env"]
    flags = frozenset({"kubernetes.podspec-nodeselector", "kubernetes.podspec-tolerations"})
    validate(comp, flags)
    mem = next(o for o in objs if is_knative(o) and o["metadata"]["name"].endswith("memory"))
    assert "nodeSelector" not in mem["spec"]["template"]["spec"]
    fn = next(
        o
        for o in render({**values, "platform": "openfaas"})
        if is_function(o) and o["metadata"]["name"].endswith("compute")
    )
    assert fn["spec"]["constraints"] == ["gpu=a100"]
    assert fn["spec"]["environment"]["GNN_FAAS_THREADS"] == "2"


def test_pdb_only_with_two_gateway_replicas():
    assert not [o for o in render(None) if o["kind"] == "PodDisruptionBudget"]
    (pdb,) = [o for o in render(None, "gateway.replicas=2") if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1


def test_gateway_waits_as_long_as_knative_does():
    cm = next(o for o in render(None, "knative.progressDeadline=900s") if o["kind"] == "ConfigMap")
    cfg = from_dict(
        ServingConfig,
        yaml.safe_load(cm["data"]["serving.yaml"].replace("${GNN_FAAS_STORE}", "s3://x")),
    )
    assert cfg.platform.knative.start_timeout_s == 900
    cm = next(o for o in render(None, "platform=openfaas") if o["kind"] == "ConfigMap")
    cfg = from_dict(
        ServingConfig,
        yaml.safe_load(cm["data"]["serving.yaml"].replace("${GNN_FAAS_STORE}", "s3://x")),
    )
    assert cfg.platform.openfaas.start_timeout_s == 600
    assert cfg.platform.openfaas.credentials_secret == "openfaas/basic-auth"


def test_helm_test_pod_sends_one_inference_per_model():
    values = {"models": [{"name": "a", "graph": "g"}, {"name": "b", "graph": "g"}]}
    pod = next(o for o in render(values) if o["kind"] == "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MODELS"] == "a,b"
    assert env["GATEWAY_URL"] == "http://gnn-faas-gateway.default.svc:8080"
    assert c["command"][:2] == ["python", "-c"]
    compile(c["command"][2], "test_infer.py", "exec")
