"""``make push`` and ``make chart-push`` against a real registry on loopback, then
``helm install`` from the OCI chart with the pushed image references.

The registry is Debian's docker-registry (tests/registry.py); the images come
from ``make images`` in the test's Docker engine (tests/docker_engine.py, as the
other container tests); the chart is installed into the real kube-apiserver
(tests/kube.py). What is checked: the registry serves each pushed tag at the
digest ``make push`` recorded; the image pulls back by digest and is the image
that was built; the chart pulls back from ``oci://`` at the digest ``helm push``
printed, and installs with image references pinned to those digests.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.docker_engine import docker_engine
from tests.kube import cluster, helm
from tests.registry import manifest_digest, registry

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
APP_VERSION = yaml.safe_load((REPO / "charts" / "Chart.yaml").read_text())["appVersion"]
KINDS = ("memory", "compute", "gateway")


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(["make", "-s", *args], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=1200)  # fmt: skip
    return r


@pytest.fixture(scope="module")
def reg():
    with registry() as addr:
        yield addr


def test_push_needs_a_registry():
    for target in ("push", "chart-push"):
        r = make(target, "REGISTRY=")
        assert r.returncode != 0
        assert f"make {target}: set REGISTRY=host:port" in r.stderr


def push_chart(reg: str) -> str:
    r = make("chart-push", f"REGISTRY={reg}")
    assert r.returncode == 0, r.stdout + r.stderr
    digest = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", r.stdout, re.M).group(1)
    # the registry serves the chart's tag at the digest helm printed
    assert manifest_digest(reg, "charts/gnn-faas", APP_VERSION) == digest
    return digest


def test_chart_push_and_pull_back(reg, tmp_path):
    digest = push_chart(reg)
    ref = f"oci://{reg}/charts/gnn-faas"
    shown = helm("show", "chart", ref, "--version", APP_VERSION, "--plain-http").stdout
    assert yaml.safe_load(shown)["appVersion"] == APP_VERSION
    pulled = helm("pull", ref, "--version", APP_VERSION, "--plain-http", "-d", str(tmp_path))
    assert f"Digest: {digest}" in pulled.stdout + pulled.stderr
    assert (tmp_path / f"gnn-faas-{APP_VERSION}.tgz").is_file()


def test_images_push_pull_and_install_from_the_oci_chart(reg):
    import docker

    with docker_engine() as host:
        r = make("push", f"REGISTRY={reg}", env={"DOCKER_HOST": host})
        assert r.returncode == 0, r.stdout + r.stderr
        pushed = (REPO / "build" / "pushed-images.txt").read_text().split()
        assert len(pushed) == 3
        digests = {}
        client = docker.DockerClient(base_url=host)
        try:
            for kind, line in zip(KINDS, pushed):
                ref, _, digest = line.partition("@")
                assert ref == f"{reg}/gnn-faas-{kind}:{APP_VERSION}"
                assert manifest_digest(reg, f"gnn-faas-{kind}", APP_VERSION) == digest
                digests[kind] = digest
                # pull it back by digest: the very image that was built
                built = client.images.get(f"gnn-faas-{kind}:{APP_VERSION}").id
                client.images.remove(ref)
                pulled = client.images.pull(f"{reg}/gnn-faas-{kind}", tag=digest)
                assert pulled.id == built
        finally:
            client.close()
    # install from the OCI chart with the pushed references, pinned to their digests
    push_chart(reg)
    c = cluster()
    ns = "from-oci"
    c.kubectl("create", "namespace", ns)
    sets = ["--set", f"image.registry={reg}"]
    for kind, digest in digests.items():
        sets += ["--set", f"image.{kind}.digest={digest}"]
    r = c.helm("install", "oci", f"oci://{reg}/charts/gnn-faas", "--version", APP_VERSION,
               "--plain-http", "-n", ns, *sets)  # fmt: skip
    assert "STATUS: deployed" in r.stdout
    images = set()
    for kind in ("memory", "compute"):
        ksvc = c.get_json("ksvc", f"oci-gnn-faas-bitcoin-otc-{kind}", "-n", ns)
        images.add(ksvc["spec"]["template"]["spec"]["containers"][0]["image"])
    dep = c.get_json("deployment", "oci-gnn-faas-gateway", "-n", ns)
    images.add(dep["spec"]["template"]["spec"]["containers"][0]["image"])
    assert images == {f"{reg}/gnn-faas-{k}:{APP_VERSION}@{digests[k]}" for k in KINDS}
    c.helm("uninstall", "oci", "-n", ns)
