"""The ``gnn-faas`` entry point: usage errors and GnnFaasErrors never show a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gnn_faas.cli import build_parser, main

ENTRY = "import sys; from gnn_faas.cli import main; sys.exit(main())"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["ingest"],  # SOURCE and --name missing
        ["ingest", "x.txt", "--name", "g", "--random-features", "four"],
        ["datasets"],
        ["bench", "fetch", "--graph", "g"],  # --store missing
    ],
)
def test_usage_errors_exit_non_zero_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert "usage: gnn-faas" in err and "Traceback" not in err


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("ingest", "datasets", "bench"):
        assert cmd in out
    assert build_parser().prog == "gnn-faas"


def test_datasets_list(capsys):
    assert main(["datasets", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["NAME", "BUNDLED"]
    assert {ln.split()[0]: ln.split()[1] for ln in lines[1:]} == {
        "bitcoin-otc": "yes",
        "cora": "yes",
        "higgs-retweet": "no",
    }


def test_errors_are_one_line_in_a_real_process(tmp_path):
    """A GnnFaasError from a handler: exit 2, one line on stderr, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-c", ENTRY, "ingest", str(tmp_path / "absent.txt"), "--name", "g",
         "--store", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("gnn-faas ingest: error:") and "absent.txt" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "store").exists()  # nothing half-written
