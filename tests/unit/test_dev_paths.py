"""The local stack's pure parts: paths, JDK discovery, ports, config, credentials. No servers."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from perago.errors import StackError
from perago_dev import build, paths, stack
from perago_dev.cli import app
from perago_dev.paths import StackPaths


def _jdk(base: Path, name: str, version: str, *, java: bool = True) -> Path:
    home = base / name
    (home / "bin").mkdir(parents=True)
    if java:
        (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


# -- paths -------------------------------------------------------------------------------------


def test_project_root_is_the_source_checkout(tmp_path: Path) -> None:
    (tmp_path / "perago-dev" / "perago_dev" / "recipes").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert paths.find_project_root([nested, *nested.parents]) == tmp_path
    assert paths.find_project_root([tmp_path / "a"]) is None


def test_stack_dir_defaults_to_the_checkout_and_follows_the_override(tmp_path: Path) -> None:
    default = paths.stack_paths(env={})
    assert default.root is not None and default.stack == default.root / ".stack"
    moved = paths.stack_paths(env={"PERAGO_STACK_DIR": str(tmp_path / "s")})
    assert moved.stack == tmp_path / "s"
    assert moved.pid_file("lakefs") == tmp_path / "s" / "run" / "lakefs.pid"


def test_an_installed_package_builds_from_its_own_recipes_into_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From one's own project (no checkout): the recipes are package data, the state goes to
    the user's cache folder unless PERAGO_STACK_DIR says otherwise."""
    monkeypatch.setattr(paths, "find_project_root", lambda candidates=None: None)
    own = paths.stack_paths(env={"HOME": str(tmp_path)})
    assert own.root is None and own.stack == tmp_path / ".cache" / "perago" / "stack"
    xdg = paths.stack_paths(env={"XDG_CACHE_HOME": str(tmp_path / "c")})
    assert xdg.stack == tmp_path / "c" / "perago" / "stack"
    for recipe in ("lakefs/go.mod", "lakefs/go.sum", "lakectl/main.go", "conductor/pom.xml"):
        assert (own.deploy / recipe).is_file(), recipe


# -- JDK discovery -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('JAVA_VERSION="25.0.3"', 25),
        ('JAVA_VERSION="21"', 21),
        ('JAVA_VERSION="17.0.15"', 17),
        ('JAVA_VERSION="1.8.0_392"', 8),
        ('IMPLEMENTOR="x"', None),
    ],
)
def test_release_file_versions(text: str, version: int | None) -> None:
    assert build.parse_java_version(text) == version


def test_newest_jdk_at_least_21_is_chosen(tmp_path: Path) -> None:
    _jdk(tmp_path, "java-17-openjdk", "17.0.15")
    _jdk(tmp_path, "jdk-21", "21.0.5")
    newest = _jdk(tmp_path, "temurin-25-jdk", "25.0.3")
    _jdk(tmp_path, "broken-26", "26", java=False)  # a release file without bin/java
    assert build.find_java(env={}, search_dirs=[tmp_path]) == newest.resolve() / "bin" / "java"


def test_macos_bundle_layout_is_found(tmp_path: Path) -> None:
    home = _jdk(tmp_path / "temurin-21.jdk", "Contents/Home", "21.0.2")
    assert build.find_java(env={}, search_dirs=[tmp_path]) == home.resolve() / "bin" / "java"


def test_java_home_wins_when_new_enough(tmp_path: Path) -> None:
    _jdk(tmp_path / "system", "jdk-25", "25.0.1")
    home = _jdk(tmp_path, "jdk-21", "21.0.5")
    found = build.find_java(env={"JAVA_HOME": str(home)}, search_dirs=[tmp_path / "system"])
    assert found == home / "bin" / "java"


def test_an_old_java_home_is_passed_over(tmp_path: Path) -> None:
    newer = _jdk(tmp_path / "system", "jdk-25", "25.0.1")
    old = _jdk(tmp_path, "jdk-17", "17.0.15")
    found = build.find_java(env={"JAVA_HOME": str(old)}, search_dirs=[tmp_path / "system"])
    assert found == newer.resolve() / "bin" / "java"


def test_no_suitable_jdk_explains_how_to_get_one(tmp_path: Path) -> None:
    old = _jdk(tmp_path, "jdk-17", "17.0.15")
    with pytest.raises(StackError, match=r"JDK >= 21.*PERAGO_CONDUCTOR_JAVA"):
        build.find_java(env={"JAVA_HOME": str(old)}, search_dirs=[tmp_path])


def test_override_accepts_a_java_or_a_jdk_folder(tmp_path: Path) -> None:
    home = _jdk(tmp_path, "any", "17.0.1")  # the user's choice is not second-guessed
    java = home / "bin" / "java"
    assert build.find_java(env={"PERAGO_CONDUCTOR_JAVA": str(java)}, search_dirs=[]) == java
    assert build.find_java(env={"PERAGO_CONDUCTOR_JAVA": str(home)}, search_dirs=[]) == java
    with pytest.raises(StackError, match="PERAGO_CONDUCTOR_JAVA"):
        build.find_java(env={"PERAGO_CONDUCTOR_JAVA": str(tmp_path / "nope")}, search_dirs=[])


# -- ports -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["x", "0", "65536", "-1", ""])
def test_bad_ports_name_the_variable(value: str) -> None:
    with pytest.raises(StackError, match="PERAGO_LAKEFS_PORT"):
        stack.parse_port(value, name="PERAGO_LAKEFS_PORT")


def test_port_parsing() -> None:
    assert stack.parse_port(" 18000 ", name="X") == 18000


def _paths(tmp_path: Path) -> StackPaths:
    p = StackPaths(root=tmp_path, stack=tmp_path / ".stack")
    p.make()
    return p


_PRODUCTION_ONLY = {"postgres": 18432, "s3": 18900}


def test_ports_default_then_environment_then_saved(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    assert stack.resolve_ports(p, {}) == {"lakefs": 18000, "conductor": 18080, **_PRODUCTION_ONLY}
    env = {"PERAGO_LAKEFS_PORT": "19000", "PERAGO_POSTGRES_PORT": "19432"}
    assert stack.resolve_ports(p, env) == {
        "lakefs": 19000,
        "conductor": 18080,
        "postgres": 19432,
        "s3": 18900,
    }
    p.ports.write_text(json.dumps({"lakefs": 19000, "conductor": 19080, "s3": 19900}))
    assert stack.resolve_ports(p, {}) == {
        "lakefs": 19000,
        "conductor": 19080,
        "postgres": 18432,
        "s3": 19900,
    }


def test_a_running_service_keeps_its_saved_port(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    p.ports.write_text(json.dumps({"lakefs": 19000, "conductor": 19080}))
    env = {"PERAGO_LAKEFS_PORT": "20000", "PERAGO_CONDUCTOR_PORT": "20080"}
    ports = stack.resolve_ports(p, env, running=frozenset({"lakefs"}))
    assert ports == {"lakefs": 19000, "conductor": 20080, **_PRODUCTION_ONLY}


def test_ports_from_an_older_stack_folder_are_kept(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    p.credentials.write_text(json.dumps({"lakefs_port": "18100", "conductor_port": "18180"}))
    assert stack.resolve_ports(p, {}) == {"lakefs": 18100, "conductor": 18180, **_PRODUCTION_ONLY}


def test_services_cannot_share_a_port(tmp_path: Path) -> None:
    env = {"PERAGO_LAKEFS_PORT": "18080"}
    with pytest.raises(StackError, match="cannot share port 18080"):
        stack.resolve_ports(_paths(tmp_path), env)
    env = {"PERAGO_S3_PORT": "18432"}  # the production profile's too
    with pytest.raises(StackError, match="PERAGO_POSTGRES_PORT and PERAGO_S3_PORT"):
        stack.resolve_ports(_paths(tmp_path), env)


def test_a_running_profile_is_never_switched_under_it(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    p.run.mkdir(parents=True, exist_ok=True)
    p.profile_file.write_text("production\n")
    with pytest.raises(StackError, match=r"the production stack is running; run `perago dev down`"):
        stack._check_profile(p, "embedded", {"lakefs": 1})
    stack._check_profile(p, "production", {"lakefs": 1})  # the same profile: reused
    stack._check_profile(p, "embedded", {})  # nothing runs: any profile may start


def test_a_profile_is_named_or_refused(tmp_path: Path) -> None:
    assert stack.resolve_profile(None, {}) == "embedded"
    assert stack.resolve_profile(None, {"PERAGO_STACK_PROFILE": "production"}) == "production"
    assert stack.resolve_profile("embedded", {"PERAGO_STACK_PROFILE": "production"}) == "embedded"
    with pytest.raises(StackError, match=r"--profile='prod' is not a profile; use one of"):
        stack.resolve_profile("prod", {})
    with pytest.raises(StackError, match=r"PERAGO_STACK_PROFILE='x' is not a profile"):
        stack.resolve_profile(None, {"PERAGO_STACK_PROFILE": "x"})


# -- config and credentials ------------------------------------------------------------------------


def test_credentials_are_generated_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "s" / "credentials.json"
    first = stack.load_credentials(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack.load_credentials(path) == first
    assert first.access_key_id.startswith("AKIA") and len(first.access_key_id) == 20
    assert first.access_key_id[4:].isupper() or first.access_key_id[4:].isdigit()
    assert len(first.secret_access_key) == 40
    assert json.loads(path.read_text())["secret_access_key"] == first.secret_access_key
    assert stack.load_credentials(tmp_path / "other.json") != first


def test_a_corrupt_credentials_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text("{not json")
    with pytest.raises(StackError, match="unreadable"):
        stack.load_credentials(path)


def test_lakefs_config_is_loopback_local_and_quiet(tmp_path: Path) -> None:
    creds = stack.Credentials("AKIAEXAMPLE", "s3cr'et\"x", "enc")
    data = tmp_path / "dir with space" / "lakefs"
    text = stack.render_lakefs_config(data=data, port=18123, credentials=creds)
    config = yaml.safe_load(text)
    assert config["listen_address"] == "127.0.0.1:18123"
    assert config["database"] == {"type": "local", "local": {"path": f"{data}/metadata"}}
    assert config["blockstore"] == {"type": "local", "local": {"path": f"{data}/block"}}
    assert config["committed"]["local_cache"]["dir"] == f"{data}/cache"
    assert config["auth"]["encrypt"]["secret_key"] == "enc"
    assert config["installation"] == {
        "user_name": "perago",
        "access_key_id": "AKIAEXAMPLE",
        "secret_access_key": "s3cr'et\"x",
    }
    assert config["stats"]["enabled"] is False
    assert config["security"]["check_latest_version"] is False


def test_conductor_command_binds_loopback_with_sqlite(tmp_path: Path) -> None:
    cmd = stack.conductor_command(
        java=Path("/j/bin/java"), jar=Path("/s/c.jar"), data=tmp_path, port=18181
    )
    assert cmd[0] == "/j/bin/java" and cmd[cmd.index("-jar") + 1] == "/s/c.jar"
    assert "--server.port=18181" in cmd and "--server.address=127.0.0.1" in cmd
    assert f"--spring.datasource.url=jdbc:sqlite:{tmp_path}/conductor.db" in " ".join(cmd)
    assert "--conductor.queue.type=sqlite" in cmd


def test_credentials_of_an_older_stack_gain_s3_keys_and_keep_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    old = {"access_key_id": "AKIAOLD", "secret_access_key": "old", "encrypt_secret": "enc"}
    path.write_text(json.dumps(old))
    creds = stack.load_credentials(path)
    assert (creds.access_key_id, creds.secret_access_key, creds.encrypt_secret) == (
        "AKIAOLD",
        "old",
        "enc",
    )
    assert creds.s3_access_key_id.startswith("AKIA") and len(creds.s3_secret_access_key) == 40
    assert stack.load_credentials(path) == creds  # saved, not generated again


def test_production_lakefs_config_is_postgres_and_s3_with_presigning(tmp_path: Path) -> None:
    from perago_dev import production

    creds = stack.Credentials("AKIAEXAMPLE", "secret", "enc", "AKIAS3", "s3secret")
    text = stack.render_lakefs_config(
        data=tmp_path,
        port=18000,
        credentials=creds,
        database=production.lakefs_database(18432),
        blockstore=production.lakefs_blockstore(
            s3_port=18900, s3_key="AKIAS3", s3_secret="s3secret"
        ),
    )
    config = yaml.safe_load(text)
    assert config["database"] == {
        "type": "postgres",
        "postgres": {
            "connection_string": "postgres://postgres@127.0.0.1:18432/lakefs?sslmode=disable"
        },
    }
    blockstore = config["blockstore"]
    assert blockstore["type"] == "s3"
    assert blockstore["default_namespace_prefix"] == "s3://perago-data/"
    assert blockstore["s3"]["endpoint"] == "http://127.0.0.1:18900"
    assert blockstore["s3"]["force_path_style"] is True
    assert blockstore["s3"]["credentials"] == {
        "access_key_id": "AKIAS3",
        "secret_access_key": "s3secret",
    }
    assert "disable_pre_signed" not in blockstore["s3"]  # lakeFS pre-signs by default


def test_conductor_command_on_postgres_moves_every_store(tmp_path: Path) -> None:
    cmd = stack.conductor_command(
        java=Path("/j/bin/java"), jar=Path("/s/c.jar"), data=tmp_path, port=18080, postgres_port=5
    )
    url = "jdbc:postgresql://127.0.0.1:5/conductor"
    assert f"--spring.datasource.url={url}" in cmd
    for kind in ("db", "queue", "indexing", "workflow-execution-lock", "external-payload-storage"):
        assert f"--conductor.{kind}.type=postgres" in cmd
    assert not [a for a in cmd if "sqlite" in a]


def test_postgres_runs_loopback_only_without_a_socket_folder(tmp_path: Path) -> None:
    from perago_dev import production

    cmd = production.postgres_command(Path("/pg/bin"), tmp_path / "data", 18432)
    assert cmd[:5] == ["/pg/bin/postgres", "-D", str(tmp_path / "data"), "-p", "18432"]
    assert "listen_addresses=127.0.0.1" in cmd and "unix_socket_directories=" in cmd


def test_a_missing_postgres_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_POSTGRES_DIRS", (str(tmp_path / "none" / "*" / "bin"),))
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    with pytest.raises(StackError, match=r"apt-get install postgresql.*PERAGO_POSTGRES_BIN"):
        build.postgres_bin({})
    with pytest.raises(StackError, match=r"PERAGO_POSTGRES_BIN=/nowhere has no initdb"):
        build.postgres_bin({"PERAGO_POSTGRES_BIN": "/nowhere"})
    for tool in ("initdb", "postgres"):
        (tmp_path / "pg" / "16" / "bin").mkdir(parents=True, exist_ok=True)
        (tmp_path / "pg" / "16" / "bin" / tool).write_text("")
    (tmp_path / "pg" / "9" / "bin").mkdir(parents=True)
    for tool in ("initdb", "postgres"):
        (tmp_path / "pg" / "9" / "bin" / tool).write_text("")
    monkeypatch.setattr(build, "_POSTGRES_DIRS", (str(tmp_path / "pg" / "*" / "bin"),))
    assert build.postgres_bin({}) == tmp_path / "pg" / "16" / "bin"  # the newest


def test_a_pid_that_is_not_our_binary_is_never_ours(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    p.pid_file("lakefs").write_text("1")  # alive, but not started by this stack
    p.pid_file("conductor").write_text("999999999")  # no such process
    assert stack._pid(p, "lakefs") is None and stack._pid(p, "conductor") is None


# -- perago dev env ---------------------------------------------------------------------------


def test_env_prints_single_quoted_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERAGO_STACK_DIR", str(tmp_path / "st'ack"))
    monkeypatch.setenv("PERAGO_CONDUCTOR_PORT", "18181")
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    creds = json.loads((tmp_path / "st'ack" / "credentials.json").read_text())
    assert lines == [
        "export CONDUCTOR_SERVER_URL='http://127.0.0.1:18181/api'",
        "export LAKECTL_SERVER_ENDPOINT_URL='http://127.0.0.1:18000'",
        f"export LAKECTL_CREDENTIALS_ACCESS_KEY_ID='{creds['access_key_id']}'",
        f"export LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY='{creds['secret_access_key']}'",
        f"export PATH='{tmp_path}/st'\"'\"'ack/bin':\"$PATH\"",
    ]


def test_errors_are_one_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERAGO_STACK_DIR", str(tmp_path))
    monkeypatch.setenv("PERAGO_LAKEFS_PORT", "abc")
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: PERAGO_LAKEFS_PORT='abc' is not a TCP port")
    assert "Traceback" not in result.output


# -- clear errors ----------------------------------------------------------------------------


def test_a_busy_port_names_the_variable_to_set(tmp_path: Path) -> None:
    p = _paths(tmp_path)
    creds = stack.load_credentials(p.credentials)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        message = rf"port {port} is in use by another process; stop it or set PERAGO_LAKEFS_PORT"
        with pytest.raises(StackError, match=message):
            stack._start(p, "embedded", "lakefs", {**stack.DEFAULT_PORTS, "lakefs": port}, creds)
    assert not p.pid_file("lakefs").exists()


def test_missing_go_and_maven_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "go.mod").write_text("module x\n\ngo 1.26.4\n")
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    with pytest.raises(StackError, match=r"Go >= 1\.26\.4 is required.*install it"):
        build._require_go(tmp_path)
    with pytest.raises(StackError, match=r"Maven is required.*install"):
        build._require_mvn()


def test_a_failed_build_step_quotes_the_command_and_the_log_tail(tmp_path: Path) -> None:
    script = "for i in $(seq 1 30); do echo line-$i; done; exit 3"
    log = tmp_path / "logs" / "build-x.log"
    with pytest.raises(StackError) as caught:
        build._run(["sh", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, log=log)
    message = caught.value.message
    assert "exit 3" in message and "sh -c 'for i in" in message and str(log) in message
    assert "line-11\n" in message and "line-30" in message and "line-10\n" not in message
