from __future__ import annotations

from datetime import timedelta

import pytest

from perago import config
from perago.errors import ConfigError
from perago.worker import failpoints


def test_settings_come_from_the_injected_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_SERVER_URL", "http://ignored:1/api")
    s = config.load(
        env={
            "CONDUCTOR_SERVER_URL": "http://c:8080",
            "LAKECTL_SERVER_ENDPOINT_URL": "http://l:8000/api/v1/",
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": "AKIA",
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": "very-secret",
            "PERAGO_CONCURRENCY": "4",
            "PERAGO_SHUTDOWN_GRACE": "2.5",
        }
    )
    assert s.conductor_server_url == "http://c:8080/api"
    assert s.lakefs_api_url == "http://l:8000/api/v1"
    assert s.concurrency == 4
    assert s.shutdown_grace == timedelta(seconds=2.5)
    assert "very-secret" not in repr(s) and "very-secret" not in str(s.model_dump())


def test_bad_settings_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        config.load(env={"PERAGO_CONCURRENCY": "zero"})
    with pytest.raises(ConfigError, match="unknown settings"):
        config.load(env={}, not_a_setting=1)


def test_missing_lakefs_credentials_are_reported() -> None:
    with pytest.raises(ConfigError, match="perago dev env"):
        config.load(env={}).require_lakefs_credentials()


def test_failpoint_spec_parsing() -> None:
    assert failpoints.parse("after_publish=kill, after_stage=pause:1.5") == {
        "after_publish": "kill",
        "after_stage": "pause:1.5",
    }
    for bad in ("nowhere=kill", "after_body=explode", "after_body=pause:soon"):
        with pytest.raises(ConfigError):
            failpoints.parse(bad)


def test_a_counted_failpoint_acts_on_its_nth_arrival_only() -> None:
    assert failpoints.parse("after_lease=error@3") == {"after_lease": "error@3"}
    for bad in ["after_lease=error@0", "after_lease=error@x", "after_lease=error@"]:
        if bad.endswith("@"):
            assert failpoints.parse(bad) == {"after_lease": "error"}
            continue
        with pytest.raises(ConfigError, match="count of arrivals"):
            failpoints.parse(bad)
    failpoints.configure(env={"PERAGO_FAILPOINTS": "after_lease=error@3"})
    try:
        failpoints.hit("after_lease")
        failpoints.hit("after_lease")
        with pytest.raises(failpoints.FailpointError):
            failpoints.hit("after_lease")
        failpoints.hit("after_lease")  # only the third
    finally:
        failpoints.configure(env={})


def test_error_failpoint_raises_and_unset_is_a_no_op() -> None:
    failpoints.configure(env={})
    failpoints.hit("after_body")
    failpoints.configure(env={"PERAGO_FAILPOINTS": "after_body=error"})
    try:
        with pytest.raises(failpoints.FailpointError):
            failpoints.hit("after_body")
    finally:
        failpoints.configure(env={})
