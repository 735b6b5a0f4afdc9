"""Real Helm, kubectl and a real kube-apiserver for the chart and platform tests.

Everything comes from ``../shared/tools/kube-apiserver.sh`` (beside the
repository): ``tools`` (helm v4.1.4, kubectl v1.35.2), ``build`` (kube-apiserver
1.20.2, built once and cached, a few minutes the first time), ``start DIR`` /
``stop DIR`` and ``crds OUT`` (Knative Serving's CRDs as that server accepts
them). :func:`cluster` starts one API server per test session (whichever test
directory asks first) with Knative's CRDs applied and established, and stops
it at exit. Helpers run helm/kubectl with the cluster's kubeconfig.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts"
SCRIPT = ROOT.parent / "shared" / "tools" / "kube-apiserver.sh"
CRDS = ROOT.parent / "shared" / "crds"


def _script(*args: str, timeout: float = 1200) -> str:
    if not SCRIPT.is_file():
        raise RuntimeError(f"{SCRIPT} is missing: the tests need ../shared beside the repository")
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if r.returncode != 0:
        raise RuntimeError(f"kube-apiserver.sh {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    lines = r.stdout.strip().splitlines()
    return lines[-1] if lines else ""


_tools_lock = threading.Lock()
_tools: Path | None = None


def tools_dir() -> Path:
    """The directory holding real ``helm`` and ``kubectl``."""
    global _tools
    with _tools_lock:
        if _tools is None:
            _tools = Path(_script("tools"))
        return _tools


def helm(*args: str, kubeconfig: str | None = None, check: bool = True, timeout: float = 300):
    """Run helm; returns the CompletedProcess (text)."""
    env = {**os.environ, "HELM_CACHE_HOME": str(_helm_home() / "cache")}
    env["HELM_CONFIG_HOME"] = str(_helm_home() / "config")
    env["HELM_DATA_HOME"] = str(_helm_home() / "data")
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    r = subprocess.run(
        [str(tools_dir() / "helm"), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


_home: Path | None = None


def _helm_home() -> Path:
    global _home
    if _home is None:
        _home = Path(tempfile.mkdtemp(prefix="gnn-faas-helm-"))
        atexit.register(shutil.rmtree, _home, True)
    return _home


def render(values: dict | None = None, *sets: str, release: str = "gnn-faas", ns: str = "default"):
    """``helm template`` of the chart with ``values`` (a values file) and
    ``--set`` pairs; the rendered objects as dicts."""
    args = ["template", release, str(CHART), "--namespace", ns]
    for s in sets:
        args += ["--set", s]
    with tempfile.TemporaryDirectory() as tmp:
        if values:
            path = Path(tmp, "values.yaml")
            path.write_text(yaml.safe_dump(values))
            args += ["-f", str(path)]
        out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@dataclass
class Cluster:
    dir: Path
    kubeconfig: str

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout=120):
        r = subprocess.run(
            [str(tools_dir() / "kubectl"), "--kubeconfig", self.kubeconfig, *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{r.stderr}")
        return r

    def get_json(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300):
        return helm(*args, kubeconfig=self.kubeconfig, check=check, timeout=timeout)

    def stop(self) -> None:
        _script("stop", str(self.dir), timeout=60)


_cluster_lock = threading.Lock()
_cluster: Cluster | None = None


def cluster() -> Cluster:
    """The session's API server (started on first use, stopped at exit), with
    Knative Serving's CRDs applied and established."""
    global _cluster
    with _cluster_lock:
        if _cluster is not None:
            return _cluster
        tools_dir()
        d = Path(tempfile.mkdtemp(prefix="gnn-faas-kube-"))
        kubeconfig = _script("start", str(d))
        c = Cluster(d, kubeconfig)

        def _stop() -> None:
            try:
                c.stop()
            finally:
                shutil.rmtree(d, ignore_errors=True)

        atexit.register(_stop)
        crds = _script("crds", str(d / "crds"))
        c.kubectl("apply", "-f", crds)
        c.kubectl("wait", "--for", "condition=established", "crd", "--all", "--timeout=60s")
        _cluster = c
        return c
