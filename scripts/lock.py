"""The lock files of gnn-faas's install targets, and the check that they match pyproject.toml.

    python3 scripts/lock.py compile [--uv UV] [--torch-wheels DIR] [TARGET ...]   (make lock)
    python3 scripts/lock.py check [--root DIR]                   (offline; tests/test_locks.py)

Each target is pyproject.toml's core dependencies plus some of its extras, resolved by
``uv pip compile --generate-hashes`` for one Python and platform into ``locks/TARGET.txt``:
every package pinned with ``==`` and the sha256 of each of its files. Installs run
``pip install --require-hashes --no-deps -r locks/TARGET.txt``: nothing is resolved, and a
file whose hash is not in the lock is refused.

Each lock's header records ``inputs-sha256``, a hash of what it was compiled from (the
requirement strings of its extras, the Python, the platform, the constraints and what is left
out). ``check`` recomputes it from pyproject.toml and also checks that every direct
requirement is pinned to a version its specifier allows and that every pin carries a hash, so
an edited pyproject.toml with stale locks fails the tests until ``make lock`` runs.

torch: the venv and the compute image take torch from the CPU wheel on disk (``/opt/wheels``,
``TORCH_PIN``), never a CUDA build. The resolution reads torch's own dependencies from that
wheel (a constraint ``torch==TORCH_PIN`` with ``--find-links``: the ``+cpu`` wheel names no
``nvidia-*`` packages, PyPI's build of the same version does) and then leaves torch out of the
dev and compute locks (``--no-emit-package torch``). ``locks/torch-cpu.txt`` pins torch alone,
with the hash of the wheel on disk, and is installed first with ``--no-index --find-links``:
pip's only candidate is that file, and its hash is checked.

Standard library only, except ``packaging`` for the check (pip, pytest and the dev venv have
it); ``compile`` needs uv (the ``lock`` extra) and the package index.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from requirements import requirements  # noqa: E402  (scripts/requirements.py)

ROOT = Path(__file__).resolve().parents[1]
TORCH_PIN = "2.13.0+cpu"
# What the images and the venv run: Debian bookworm's CPython 3.11 on x86-64 (glibc 2.36).
PYTHON = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
# Distributions a lent GPU machine already has (its CUDA torch, PyG, numpy and scipy):
# `make gpu-wheels` carries the rest of the core's closure (docs/gpu-check.md).
GPU_HAS = ("numpy", "scipy", "torch")


@dataclass(frozen=True)
class Target:
    """One install: ``extras`` of pyproject.toml (the core dependencies always, unless
    ``build``: then the ``[build-system] requires``) for ``python``."""

    name: str
    what: str
    extras: tuple[str, ...] = ()
    python: str = PYTHON
    no_emit: tuple[str, ...] = ()
    build: bool = False

    @property
    def path(self) -> str:
        return f"locks/{self.name}.txt"


TARGETS = (
    Target("dev", "the dev/test venv (make install)", ("all", "test", "docs", "lock"), no_emit=("torch",)),
    Target("memory", "gnn_faas/functions/memory.Dockerfile", ("s3", "redis")),
    Target(
        "compute", "gnn_faas/functions/compute.Dockerfile, after torch-cpu.txt",
        ("compute", "train", "s3", "redis"), no_emit=("torch",),
    ),  # fmt: skip
    Target("gateway", "gnn_faas/gateway/Dockerfile", ("gateway", "docker", "kubernetes", "s3", "redis")),
    Target("build", "setuptools, to build gnn_faas in the images (--no-build-isolation)", build=True),
    Target("gpu", "make gpu-wheels: the core a GPU machine lacks (Python 3.12)", python="3.12", no_emit=GPU_HAS),
)  # fmt: skip
TORCH_LOCK = "locks/torch-cpu.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;@]", req, maxsplit=1)[0]).lower()


def direct_requirements(pyproject: dict, target: Target) -> list[str]:
    """The requirement strings ``target`` is compiled from (pyproject order)."""
    if target.build:
        return list(pyproject["build-system"]["requires"])
    return requirements(pyproject, list(target.extras), set())


def inputs_sha256(pyproject: dict, target: Target) -> str:
    """A hash of everything ``target``'s lock is compiled from."""
    reqs = direct_requirements(pyproject, target)
    torch = [f"torch=={TORCH_PIN}"] if "torch" in {_name(r) for r in reqs} else []
    doc = {
        "requirements": sorted(reqs), "python": target.python, "platform": PLATFORM,
        "constraints": torch, "no_emit": sorted(target.no_emit),
    }  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def torch_inputs_sha256(pyproject: dict) -> str:
    specs = sorted(
        {r for t in TARGETS for r in direct_requirements(pyproject, t) if _name(r) == "torch"}
    )
    doc = {"pin": f"torch=={TORCH_PIN}", "specifiers": specs, "python": PYTHON}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def header(path: str, what: str, sha: str, command: list[str]) -> str:
    return (
        f"# {path}: {what}.\n"
        "# Generated by `make lock` (scripts/lock.py) from pyproject.toml; do not edit.\n"
        f"# {' '.join(command)}\n"
        f"# inputs-sha256: {sha}\n"
    )


def _uv_compile(uv: str, reqs: list[str], args: list[str], out: Path) -> None:
    # run where the input lies, so the lock's "# via -r requirements.in" names no temporary path
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "requirements.in").write_text("\n".join(reqs) + "\n")
        cmd = [
            uv,
            "pip",
            "compile",
            "requirements.in",
            "--generate-hashes",
            "--no-header",
            "--quiet",
        ]
        subprocess.run([*cmd, *args, "-o", str(out.resolve())], check=True, cwd=tmp)


def compile_target(pyproject: dict, target: Target, uv: str, torch_wheels: str) -> None:
    reqs = direct_requirements(pyproject, target)
    args = ["--python-version", target.python, "--python-platform", PLATFORM]
    for pkg in target.no_emit:
        args += ["--no-emit-package", pkg]
    out = ROOT / target.path
    with tempfile.TemporaryDirectory() as tmp:
        if "torch" in {_name(r) for r in reqs}:
            con = Path(tmp) / "constraints.txt"
            con.write_text(f"torch=={TORCH_PIN}\n")
            args_run = [*args, "--find-links", torch_wheels, "-c", str(con)]
            shown = [*args, "--find-links", torch_wheels, "-c", f"<torch=={TORCH_PIN}>"]
        else:
            args_run, shown = args, args
        _uv_compile(uv, reqs, args_run, out)
    body = out.read_text()
    shown_cmd = ["uv pip compile --generate-hashes", *shown]
    out.write_text(
        header(target.path, target.what, inputs_sha256(pyproject, target), shown_cmd) + body
    )


def compile_torch(pyproject: dict, uv: str, torch_wheels: str) -> None:
    """torch alone from the wheel on disk. uv records no hash for a file found through
    ``--find-links``, so the wheel's own sha256 is added to its pin here."""
    args = ["--python-version", PYTHON, "--python-platform", PLATFORM, "--no-deps", "--no-index"]
    args += ["--find-links", torch_wheels]
    out = ROOT / TORCH_LOCK
    _uv_compile(uv, [f"torch=={TORCH_PIN}"], args, out)
    wheels = sorted(Path(torch_wheels).glob(f"torch-{TORCH_PIN}-*.whl"))
    hashes = " ".join(f"--hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}" for w in wheels)
    body = re.sub(rf"^torch=={re.escape(TORCH_PIN)}$", rf"torch=={TORCH_PIN} \\\n    {hashes}",
                  out.read_text(), flags=re.M)  # fmt: skip
    what = "torch alone, the CPU wheel on disk (pip install --no-index --find-links DIR)"
    cmd = ["uv pip compile --generate-hashes", *args]
    out.write_text(header(TORCH_LOCK, what, torch_inputs_sha256(pyproject), cmd) + body)


@dataclass(frozen=True)
class Lock:
    sha: str | None
    pins: dict[str, str]  # normalised name -> version
    hashes: dict[str, int]  # normalised name -> number of --hash options


def read_lock(path: Path) -> Lock:
    sha, pins, hashes, current = None, {}, {}, None
    for line in path.read_text().splitlines():
        if line.startswith("# inputs-sha256:"):
            sha = line.split(":", 1)[1].strip()
        m = _PIN.match(line)
        if m:
            current = _name(m.group(1))
            if current in pins:
                raise ValueError(f"{path.name}: {current} pinned twice")
            pins[current], hashes[current] = m.group(2), 0
        if current is not None:
            hashes[current] += line.count("--hash=sha256:")
    return Lock(sha, pins, hashes)


def check(root: Path = ROOT) -> list[str]:
    """Every way pyproject.toml and ``root/locks`` disagree, one sentence each ([] = none)."""
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    problems: list[str] = []
    locks: dict[str, Lock] = {}
    for path, sha in [(t.path, inputs_sha256(pyproject, t)) for t in TARGETS] + [
        (TORCH_LOCK, torch_inputs_sha256(pyproject))
    ]:
        if not (root / path).is_file():
            problems.append(f"{path} is missing: run make lock")
            continue
        try:
            lock = locks[path] = read_lock(root / path)
        except ValueError as e:
            problems.append(str(e))
            continue
        if lock.sha != sha:
            problems.append(
                f"{path} was compiled from other inputs than pyproject.toml's: run make lock"
            )
        problems += [
            f"{path}: {n}=={lock.pins[n]} has no --hash" for n, k in lock.hashes.items() if k == 0
        ]
    torch = locks.get(TORCH_LOCK)
    if torch is not None and (set(torch.pins) != {"torch"} or torch.pins["torch"] != TORCH_PIN):
        problems.append(f"{TORCH_LOCK} must pin torch=={TORCH_PIN} alone, not {torch.pins}")
    for target in TARGETS:
        lock = locks.get(target.path)
        if lock is None:
            continue
        env = {"python_version": target.python, "python_full_version": target.python + ".0",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "os_name": "posix", "implementation_name": "cpython"}  # fmt: skip
        for text in direct_requirements(pyproject, target):
            req = Requirement(text)
            name = _name(req.name)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            if name in target.no_emit:
                pinned = (torch.pins if torch and name == "torch" else {}).get(name)
                if pinned is None:
                    continue  # left for the machine that installs it (GPU_HAS)
            else:
                pinned = lock.pins.get(name)
            if pinned is None:
                problems.append(f"{target.path}: {text} is not pinned: run make lock")
            elif not req.specifier.contains(pinned, prereleases=True):
                problems.append(f"{target.path}: {name}=={pinned} does not satisfy {text}")
        leaked = sorted(n for n in lock.pins if n == "torch" or n.startswith("nvidia-"))
        if leaked:
            problems.append(f"{target.path} pins {leaked}: torch comes from {TORCH_LOCK} alone")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/lock.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="(re)write locks/ with uv (needs the package index)")
    c.add_argument("--uv", default="uv")
    c.add_argument(
        "--torch-wheels", default="/opt/wheels", help="folder holding the torch CPU wheel"
    )
    c.add_argument(
        "targets", nargs="*", help=f"default: all ({', '.join(t.name for t in TARGETS)}, torch-cpu)"
    )
    k = sub.add_parser("check", help="exit 1, saying why, when pyproject.toml and locks/ disagree")
    k.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        problems = check(args.root)
        for p in problems:
            print(f"lock check: {p}", file=sys.stderr)
        return 1 if problems else 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    known = {t.name: t for t in TARGETS}
    wanted = args.targets or [*known, "torch-cpu"]
    unknown = [n for n in wanted if n not in known and n != "torch-cpu"]
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {[*known, 'torch-cpu']}")
    if not list(Path(args.torch_wheels).glob(f"torch-{TORCH_PIN}-*.whl")):
        ap.error(f"no torch-{TORCH_PIN} wheel in {args.torch_wheels} (--torch-wheels)")
    # absolute: uv runs in a temporary folder (_uv_compile)
    uv = str(Path(args.uv).resolve()) if "/" in args.uv else shutil.which(args.uv) or args.uv
    (ROOT / "locks").mkdir(exist_ok=True)
    for name in wanted:
        print(f"make lock: locks/{name}.txt", file=sys.stderr)
        if name == "torch-cpu":
            compile_torch(pyproject, uv, args.torch_wheels)
        else:
            compile_target(pyproject, known[name], uv, args.torch_wheels)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
