"""``gnn-faas simulate``'s usage errors: a one-line message and exit code 2."""

from __future__ import annotations

import pytest

from gnn_faas.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--days", "0"], "--days must be at least 1"),
        (["--days", "2", "--warmup", "30"], "--warmup needs a window"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--request-timeout", "0"], "--request-timeout must be positive"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message, capsys):
    assert main(["simulate", "twitter", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gnn-faas simulate: error: ") and message in err
    assert "Traceback" not in err
