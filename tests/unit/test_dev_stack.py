"""The local stack's pure parts: JDK discovery, credentials, command lines. No servers."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from perago.dev import build, stack
from perago.dev.paths import StackPaths
from perago.errors import StackError


def _jdk(base: Path, name: str, version: str) -> Path:
    home = base / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'JAVA_VERSION="{version}"\n')
    return home


def test_find_java_prefers_java_home_when_new_enough(tmp_path: Path) -> None:
    home = _jdk(tmp_path, "jdk25", "25.0.1")
    assert build.find_java(env={"JAVA_HOME": str(home)}) == home / "bin" / "java"


def test_find_java_rejects_old_jdks_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _jdk(tmp_path, "jdk17", "17.0.15")
    monkeypatch.setattr(build.Path, "is_dir", lambda self: False)  # no system JVM folders
    with pytest.raises(StackError, match="JDK >= 21"):
        build.find_java(env={"JAVA_HOME": str(home)})


def test_override_wins(tmp_path: Path) -> None:
    assert build.find_java(env={"PERAGO_CONDUCTOR_JAVA": "/opt/x/bin/java"}) == Path(
        "/opt/x/bin/java"
    )


def test_credentials_are_generated_once_and_private(tmp_path: Path) -> None:
    paths = StackPaths(root=tmp_path, stack=tmp_path / ".stack")
    paths.make()
    first = stack._config(paths)
    assert stat.S_IMODE(paths.credentials.stat().st_mode) == 0o600
    assert first == stack._config(paths) == json.loads(paths.credentials.read_text())
    assert first["access_key_id"].startswith("AKIA") and len(first["secret_access_key"]) == 40


def test_lakefs_config_binds_loopback_and_disables_stats(tmp_path: Path) -> None:
    paths = StackPaths(root=tmp_path, stack=tmp_path / ".stack")
    paths.make()
    c = stack._config(paths)
    text = stack._lakefs_yaml(paths, c).read_text()
    assert f'listen_address: "127.0.0.1:{c["lakefs_port"]}"' in text
    assert "stats: { enabled: false }" in text and "type: local" in text
    assert stat.S_IMODE((paths.run / "lakefs.yaml").stat().st_mode) == 0o600


def test_a_recycled_pid_is_never_ours(tmp_path: Path) -> None:
    paths = StackPaths(root=tmp_path, stack=tmp_path / ".stack")
    paths.make()
    paths.pid_file("lakefs").write_text("1")  # init: alive, but not started by this stack
    assert stack._pid(paths, "lakefs") is None


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    paths = StackPaths(root=tmp_path, stack=tmp_path / ".stack")
    paths.make()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        c = {**stack._config(paths), "lakefs_port": str(s.getsockname()[1])}
        with pytest.raises(StackError, match=r"in use by another process.*PERAGO_LAKEFS_PORT"):
            stack._start(paths, "lakefs", c)
    assert not paths.pid_file("lakefs").exists()


def test_missing_tools_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    with pytest.raises(StackError, match="install Go"):
        build._require("go", "install Go >= 1.26.4")
