"""docs/settings.md is generated from the Settings model and must match it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from perago import config
from perago.config import Settings
from perago_dev import settings_doc
from perago_dev.cli import app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_settings_page_is_current() -> None:
    assert PAGE.is_file(), f"{PAGE} is missing: run `{settings_doc.COMMAND}`"
    assert PAGE.read_text() == settings_doc.render(), (
        f"docs/settings.md is out of date with perago/config.py: run `{settings_doc.COMMAND}` "
        "(or `python -m perago_dev.settings_doc`) and commit the result"
    )


def test_every_field_is_described_and_every_variable_is_read() -> None:
    page = settings_doc.render()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} needs a description= (it goes in the page)"
        for variable in settings_doc.env_names(name, field):
            assert f"`{variable}`" in page
    # Each listed variable is one that load() really reads for its field.
    samples = {
        "conductor_server_url": "http://conductor:8080",
        "lakefs_endpoint": "http://lakefs:8000",
        "concurrency": "7",
        "shutdown_grace": "45",
        "janitor_on_start": "false",
        "spark_conf": '{"spark.driver.memory": "2g"}',
    }
    for name, value in samples.items():
        for variable in settings_doc.env_names(name, Settings.model_fields[name]):
            loaded = config.load(env={variable: value})
            assert getattr(loaded, name) != getattr(config.load(env={}), name), variable


def test_a_secret_default_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", "do-not-print-me")
    page = settings_doc.render()
    assert "do-not-print-me" not in page
    row = next(line for line in page.splitlines() if "`lakefs_secret_access_key`" in line)
    assert "| unset |" in row


def test_machine_dependent_defaults_are_described_not_computed() -> None:
    page = settings_doc.render()
    assert str(Path.home()) not in page
    assert config.load(env={}).worker_id not in page


def test_check_and_write_from_the_command_line(tmp_path: Path) -> None:
    page = tmp_path / "settings.md"
    assert settings_doc.main(["--check", "--path", str(page)]) == 1
    assert settings_doc.main(["--path", str(page)]) == 0
    assert settings_doc.main(["--check", "--path", str(page)]) == 0
    assert page.read_text() == settings_doc.render()


def test_perago_dev_settings_doc_check_passes_on_the_checkout() -> None:
    result = CliRunner().invoke(app, ["settings-doc", "--check"])
    assert result.exit_code == 0, result.output
