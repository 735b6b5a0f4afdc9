"""A real OCI registry on loopback for the push tests: Debian's ``docker-registry``
(the CNCF Distribution registry; ``make registry-deps`` installs it).

:func:`registry` starts one on a free ``127.0.0.1`` port with its storage in a
temporary directory, waits until ``GET /v2/`` answers, yields ``host:port``
and stops it. Docker and Helm reach a loopback registry over plain HTTP.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

CONFIG = """version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {root}}}
  delete: {{enabled: true}}
http:
  addr: 127.0.0.1:{port}
"""

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def registry() -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed: `make registry-deps` installs it (apt-get)")
    with tempfile.TemporaryDirectory(prefix="gnn-faas-registry-") as tmp:
        port = _free_port()
        cfg = Path(tmp, "config.yml")
        cfg.write_text(CONFIG.format(root=Path(tmp, "data"), port=port))
        log = open(Path(tmp, "registry.log"), "w")  # noqa: SIM115  (closed below)
        proc = subprocess.Popen([binary, "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
        addr = f"127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if requests.get(f"http://{addr}/v2/", timeout=1).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"docker-registry did not start: {Path(tmp, 'registry.log').read_text()}"
                    )
                time.sleep(0.1)
            yield addr
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()


def manifest_digest(addr: str, repository: str, reference: str) -> str | None:
    """The digest the registry serves for ``repository:reference`` (None: absent)."""
    r = requests.head(
        f"http://{addr}/v2/{repository}/manifests/{reference}",
        headers={"Accept": MANIFEST_TYPES},
        timeout=10,
    )
    return r.headers.get("Docker-Content-Digest") if r.status_code == 200 else None
