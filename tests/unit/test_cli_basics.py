"""`perago --version`, the log level, and one log pipeline for structlog and stdlib records."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_LOGS = """
import logging, structlog
from perago.cli import configure_logging
configure_logging()
structlog.get_logger("perago.test").debug("ours_debug")
structlog.get_logger("perago.test").info("ours_info", workflow_id="w1")
logging.getLogger("urllib3.connectionpool").info("sdk_info")
logging.getLogger("py4j.clientserver").warning("sdk_warning %s", "x")
"""


def _perago(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perago", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_version_is_the_installed_distributions() -> None:
    out = _perago("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"perago {version('perago-runtime')}"


def _log_lines(level: str | None, libraries: str | None = None) -> list[dict[str, object]]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PERAGO_LOG_LEVEL")}
    if level:
        env["PERAGO_LOG_LEVEL"] = level
    if libraries:
        env["PERAGO_LOG_LEVEL_LIBRARIES"] = libraries
    out = subprocess.run(
        [sys.executable, "-c", _LOGS], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    # stderr is a pipe, not a terminal: every line is one JSON object.
    return [json.loads(line) for line in out.stderr.splitlines()]


def test_stdlib_records_are_rendered_like_structlog_events() -> None:
    lines = _log_lines(None)
    events = {str(e["event"]): e for e in lines}
    assert set(events) == {"ours_info", "sdk_warning x"}  # info: SDKs only when they warn
    assert events["ours_info"]["workflow_id"] == "w1"
    sdk = events["sdk_warning x"]
    assert sdk["level"] == "warning" and sdk["logger"] == "py4j.clientserver"
    assert "timestamp" in sdk and "timestamp" in events["ours_info"]


def test_log_level_from_the_environment() -> None:
    """PERAGO_LOG_LEVEL is Perago's; the libraries' records need PERAGO_LOG_LEVEL_LIBRARIES."""
    assert {e["event"] for e in _log_lines("debug")} == {
        "ours_debug",
        "ours_info",
        "sdk_warning x",
    }
    assert {e["event"] for e in _log_lines("warning")} == {"sdk_warning x"}
    assert {e["event"] for e in _log_lines("warning", libraries="info")} == {
        "sdk_info",
        "sdk_warning x",
    }


def test_an_unknown_log_level_is_a_usage_error() -> None:
    import os

    out = _perago("janitor", "--dry-run", env={**os.environ, "PERAGO_LOG_LEVEL": "loud"})
    assert out.returncode == 2
    assert "PERAGO_LOG_LEVEL" in out.stderr


def test_every_command_is_mounted() -> None:
    """A helper placed between a decorator and its command once unmounted `perago run`."""
    from perago.cli import app

    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    assert {"register", "worker", "run", "log", "janitor"} <= names
    assert not {n for n in names if n.startswith("_")}
    for command in ("run", "log"):
        shown = _perago(command, "--help")
        assert shown.returncode == 0, shown.stderr


_BROKEN = {
    "missing": "import os\nimport pyspark.sql.functionz\n",
    "syntax": "x = 1\ndef f(:\n    pass\n",
    "raises": "x = 1\nprint(parms)\n",
}


def test_modules_that_cannot_be_imported_say_what_and_where(tmp_path: Path) -> None:
    """A missing module, a SyntaxError, an exception at import: one message naming the file
    and line, rc 1, no Perago traceback; the dotted-path hint only for a file path."""
    package = tmp_path / "pipe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in _BROKEN.items():
        (package / f"{name}.py").write_text(text)

    def register(module: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perago", "register", module],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )

    expected = {
        "pipe.missing": f"imports 'pyspark.sql.functionz' ({package}/missing.py:2), which is "
        "not installed",
        "pipe.syntax": f"has a syntax error at {package}/syntax.py:2: invalid syntax",
        "pipe.raises": f"raised NameError: name 'parms' is not defined ({package}/raises.py:2)",
        "pipe/raises.py": "looks like a file path: pass the module's dotted path importable "
        "from the current directory instead, e.g. pipe.raises",
        "pipe.absent": "no module named 'pipe.absent'",
    }
    for module, message in expected.items():
        done = register(module)
        assert done.returncode == 1, (module, done.stderr)
        assert message in done.stderr, (module, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert "dotted path" not in done.stderr or module.endswith(".py"), done.stderr
