"""``gnn-faas deploy openfaas --stack stack.yml``: a faas-cli stack file.

    gnn-faas deploy openfaas --stack stack.yml [--config serving.yaml]
        [--gateway URL] [--registry ghcr.io/acme] [--tag 0.1.0] [--secret NAME ...]
    faas-cli deploy -f stack.yml

One function per model and kind from the serving config (the embedded default
without ``--config``), as the Helm chart's OpenFaaS ``Function`` objects
(scheduler/openfaas_stack.py). Kubernetes users: ``helm install gnn-faas
charts/`` deploys the same on Knative or OpenFaaS.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deploy", help="write deployment files for a function platform")
    targets = p.add_subparsers(dest="target", metavar="PLATFORM", required=True)
    o = targets.add_parser("openfaas", help="a faas-cli stack file (stack.yml)")
    o.add_argument("--stack", required=True, help="stack file to write ('-': stdout)")
    o.add_argument("--config", default=None, help="serving YAML (default: embedded)")
    o.add_argument("--gateway", default="http://127.0.0.1:8080", help="OpenFaaS gateway URL")
    o.add_argument("--registry", default="", help="registry/repository prefix of the images")
    o.add_argument("--tag", default=None, help="image tag (default: the package version)")
    o.add_argument("--instance", default="gnn-faas", help="app.kubernetes.io/instance label")
    o.add_argument("--secret", action="append", default=[], help="OpenFaaS secret to mount")
    o.add_argument("--compute-image", default=None, help="compute image holding /model")
    o.set_defaults(handler=_openfaas)


def _openfaas(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    import yaml

    from gnn_faas import __version__
    from gnn_faas.config import load_config
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.scheduler.openfaas_stack import StackOptions, stack

    if not args.gateway.startswith(("http://", "https://")):
        raise InvalidRequest(f"--gateway must be an http(s) URL, got {args.gateway!r}")
    opts = StackOptions(
        gateway=args.gateway,
        registry=args.registry,
        tag=args.tag or __version__,
        instance=args.instance,
        secrets=tuple(args.secret),
        compute_image=args.compute_image,
    )
    text = yaml.safe_dump(stack(load_config(args.config), opts), sort_keys=False)
    if args.stack == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.stack).write_text(text)
        except OSError as exc:
            raise InvalidRequest(f"cannot write {args.stack}: {exc}") from None
        print(f"wrote {args.stack}: deploy with faas-cli deploy -f {args.stack}", file=sys.stderr)
    return 0
