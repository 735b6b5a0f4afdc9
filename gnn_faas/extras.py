"""Which pip extra brings which optional module, and the message when one is missing.

The core install is what a memory function needs; everything else comes with
an extra of ``pyproject.toml``. :data:`EXTRA_OF` maps the top-level module a
feature imports to the extra that installs it, so any command that reaches a
missing optional module ends with one line naming the extra to install
(:func:`missing_extra`, used by the CLI's entry point), never a traceback.
A test checks this table against ``pyproject.toml``.
"""

from __future__ import annotations

from gnn_faas.errors import MissingExtra

# top-level import name -> (extra, distribution the extra lists)
EXTRA_OF: dict[str, tuple[str, str]] = {
    "torch": ("compute", "torch"),
    "torch_geometric": ("train", "torch-geometric"),
    "boto3": ("s3", "boto3"),
    "redis": ("redis", "redis"),
    "prometheus_client": ("gateway", "prometheus-client"),
    "sklearn": ("fit", "scikit-learn"),
    "bayes_opt": ("fit", "bayesian-optimization"),
    "threadpoolctl": ("fit", "threadpoolctl"),
    "kubernetes": ("kubernetes", "kubernetes"),
    "docker": ("docker", "docker"),
    "matplotlib": ("traces", "matplotlib"),
    "tqdm": ("traces", "tqdm"),
}


def missing_extra(exc: BaseException, feature: str) -> MissingExtra | None:
    """The :class:`MissingExtra` for an ``ImportError`` of an optional module
    (``None`` when ``exc`` is something else: a real bug keeps its traceback)."""
    if not isinstance(exc, ImportError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top not in EXTRA_OF:
        return None
    return MissingExtra(feature, EXTRA_OF[top][0], top)
