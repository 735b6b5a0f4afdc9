"""Every optional module names its pip extra when it is missing, and the
extras of pyproject.toml are the ones the code needs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from gnn_faas.extras import EXTRA_OF

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_table_matches_pyproject():
    """Each module's extra lists its distribution, and every distribution of a
    runtime extra has a module in the table (so none can be missed)."""
    for module, (extra, dist) in EXTRA_OF.items():
        assert dist in names(EXTRAS[extra]), (module, extra, dist)
    runtime = set(EXTRAS) - {"all", "test", "docs"}  # test and docs: tools, not the package
    listed = {(extra, dist) for extra, dist in EXTRA_OF.values()}
    for extra in runtime:
        for dist in names(EXTRAS[extra]):
            assert (extra, dist) in listed or dist == "torch", (extra, dist)
    assert names(EXTRAS["all"]) == {"gnn-faas"}
    assert set(re.search(r"\[(.*)\]", EXTRAS["all"][0]).group(1).split(",")) == runtime


def test_version_bounds_the_code_needs():
    fit = {re.split(r"[<>=]", r)[0]: r for r in EXTRAS["fit"]}
    # bayes_opt's acquisition module (function_sizing.py) exists from 3.0 on
    assert fit["bayesian-optimization"] == "bayesian-optimization>=3.0,<4"
    import bayes_opt

    assert int(bayes_opt.__version__.split(".")[0]) == 3
    assert "torch-geometric>=2.5" in EXTRAS["train"]
    # the gateway extra serves; fitting libraries are not in it (nor in its image)
    assert names(EXTRAS["gateway"]) == {"prometheus-client"}


# (command, module it reaches) for each extra: a fresh interpreter with the module
# made unimportable runs the real CLI
CASES = [
    (
        ["train", "--dataset", "x", "--arch", "gcn", "--store", "file:///nonexistent"],
        "torch_geometric",
        "train",
    ),
    (["serve", "compute", "--model", "/nonexistent"], "torch", "compute"),
    (["size", "--model", "/nonexistent"], "threadpoolctl", "fit"),
]


@pytest.mark.parametrize("argv, module, extra", CASES, ids=[c[1] for c in CASES])
def test_missing_extra_is_a_one_line_message(argv, module, extra):
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from gnn_faas.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert f"pip install 'gnn-faas[{extra}]'" in r.stderr, r.stderr


def test_every_module_of_the_table_gets_the_message():
    from gnn_faas.extras import missing_extra

    for module, (extra, _) in EXTRA_OF.items():
        exc = ModuleNotFoundError(f"No module named {module!r}", name=f"{module}.sub")
        msg = str(missing_extra(exc, "x"))
        assert f"needs the '{module}' package: pip install 'gnn-faas[{extra}]'" in msg
    # a module outside the table is a bug, not a missing extra: it keeps its traceback
    assert missing_extra(ModuleNotFoundError("x", name="nonexistent_mod"), "x") is None
    assert missing_extra(ValueError("x"), "x") is None
