"""lakectl's configuration file feeds the lakeFS settings, with lakectl's precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from perago import config
from perago.errors import ConfigError

_FILE = """\
credentials:
  access_key_id: AKIAFILE
  secret_access_key: file-secret
server:
  endpoint_url: http://file-host:8000/api/v1
"""


def test_the_file_named_by_lakectl_config_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "l.yaml").write_text(_FILE)
    s = config.load({"LAKECTL_CONFIG_FILE": str(tmp_path / "l.yaml")})
    assert s.lakefs_endpoint == "http://file-host:8000"
    assert s.lakefs_access_key_id == "AKIAFILE"
    assert s.lakefs_secret_access_key.get_secret_value() == "file-secret"


def test_variables_win_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "l.yaml").write_text(_FILE)
    s = config.load(
        {
            "LAKECTL_CONFIG_FILE": str(tmp_path / "l.yaml"),
            "LAKECTL_SERVER_ENDPOINT_URL": "http://env-host:1",
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": "AKIAENV",
        }
    )
    assert s.lakefs_endpoint == "http://env-host:1"
    assert s.lakefs_access_key_id == "AKIAENV"
    assert s.lakefs_secret_access_key.get_secret_value() == "file-secret"


def test_home_file_for_the_process_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".lakectl.yaml").write_text(_FILE)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.load().lakefs_access_key_id == "AKIAFILE"
    # An injected environment (tests, embedding) is not mixed with the user's file.
    assert config.load({"HOME": str(tmp_path)}).lakefs_access_key_id == ""


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "is not a file"), ("- a list", "not a YAML mapping"), ("a: [", "cannot read")],
)
def test_a_bad_file_says_what_to_fix(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "l.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        config.load({"LAKECTL_CONFIG_FILE": str(path)})
