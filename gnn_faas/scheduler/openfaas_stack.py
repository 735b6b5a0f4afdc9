"""A faas-cli stack file (``stack.yml``) for the functions of a serving config.

For teams who deploy with ``faas-cli deploy -f stack.yml`` rather than the
Helm chart: one function per model and kind, named ``MODEL-KIND`` (the name
the gateway's openfaas backend looks for in the ``gnn-faas.io/function``
label), from the prebuilt images (``skip_build``), with the same
``com.openfaas.scale.*`` labels, limits = requests and read-only root
filesystem as the chart's ``Function`` objects. Fields are faas-cli's
documented stack YAML (version 1.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gnn_faas.config import ServingConfig


@dataclass(frozen=True)
class StackOptions:
    gateway: str = "http://127.0.0.1:8080"
    registry: str = ""
    tag: str = "0.1.0"
    instance: str = "gnn-faas"  # app.kubernetes.io/instance, the backend's selector
    secrets: tuple[str, ...] = ()
    compute_image: str | None = None  # an image holding the checkpoint at /model


def _image(opts: StackOptions, name: str) -> str:
    prefix = f"{opts.registry.rstrip('/')}/" if opts.registry else ""
    return f"{prefix}{name}:{opts.tag}"


def _cpu(vcpus: float) -> str:
    return f"{int(round(vcpus * 1000))}m"


def stack(config: ServingConfig, opts: StackOptions) -> dict:
    """The stack file as a dict (``yaml.safe_dump`` it)."""
    p = config.platform
    functions = {}
    for m in config.models:
        for kind in ("memory", "compute"):
            mb = p.memory_function_mb if kind == "memory" else p.compute_function_mb
            vcpus = p.memory_vcpus if kind == "memory" else p.compute_vcpus
            max_slots = p.max_memory_instances if kind == "memory" else p.max_compute_instances
            concurrency = max(1, p.openfaas.concurrency)
            env = {"GNN_FAAS_STORE": config.store, "GNN_FAAS_GRAPH": m.graph, "MODEL_DIR": "/model"}
            image = _image(opts, f"gnn-faas-{kind}")
            if kind == "compute" and opts.compute_image:
                image = opts.compute_image
            fn = {
                "lang": "dockerfile",
                "handler": ".",
                "image": image,
                "skip_build": True,
                "environment": env,
                "labels": {
                    "app.kubernetes.io/instance": opts.instance,
                    "app.kubernetes.io/part-of": "gnn-faas",
                    "gnn-faas.io/model": m.name,
                    "gnn-faas.io/function-kind": kind,
                    "gnn-faas.io/function": f"{m.name}-{kind}",
                    "com.openfaas.scale.min": str(p.min_instances),
                    "com.openfaas.scale.max": str(max(1, math.ceil(max_slots / concurrency))),
                    "com.openfaas.scale.target": str(concurrency),
                    "com.openfaas.scale.type": "capacity",
                    "com.openfaas.scale.zero": str(p.min_instances == 0).lower(),
                    "com.openfaas.scale.zero-duration": f"{max(1, int(p.keep_alive_s // 60))}m",
                },
                "annotations": {
                    "com.openfaas.health.http.path": "/v2/health/ready",
                    "com.openfaas.ready.http.path": "/v2/health/ready",
                },
                "limits": {"memory": f"{mb}Mi", "cpu": _cpu(vcpus)},
                "requests": {"memory": f"{mb}Mi", "cpu": _cpu(vcpus)},
                "readonly_root_filesystem": True,
            }
            if opts.secrets:
                fn["secrets"] = list(opts.secrets)
            functions[f"{m.name}-{kind}"] = fn
    return {
        "version": 1.0,
        "provider": {"name": "openfaas", "gateway": opts.gateway},
        "functions": functions,
    }
