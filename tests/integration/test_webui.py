"""lakeFS's web UI on the local stack, looked at in a real browser (Debian's headless Chromium).

A person checking a Perago publication opens its commit in lakeFS's UI: the test logs in
with the stack's credentials, opens the commit a real worker published and reads the
identity metadata on the page. ``UPDATE_DOCS_SCREENSHOTS=1`` also saves the screenshot as
``docs/lakefs-ui-publication.png``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .harness import ROOT, one_step, start, wait_workflow, worker

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Flags for a closed network, as root (see Chromium's headless docs).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Any:
    if not Path(CHROMIUM).exists():
        message = "Chromium is not installed: `make install` installs Debian's chromium as root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def test_the_commit_page_of_a_publication_shows_its_identity(
    browser: Any,
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env()
    wf_name = one_step(
        conductor, f"ui_{unique}", f"pt_write_{unique}", {"files": {"report.csv": "a,b\n1,2\n"}}
    )
    with worker(env, tmp_path / "w.log") as w:
        wid = start(conductor, wf_name, repo)
        assert wait_workflow(conductor, wid)["status"] == "COMPLETED"
        w.stop()
    head = store.branch_head(repo, "main")

    lakefs = env["LAKECTL_SERVER_ENDPOINT_URL"].rstrip("/")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lakefs}/auth/login")
        page.fill("#username", env["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"])
        page.fill("#password", env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"])
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
        page.goto(f"{lakefs}/repositories/{repo}/commits/{head}")
        page.get_by_text("perago.workflow_id").wait_for(timeout=30_000)
        text = page.inner_text("body")
        shot = tmp_path / "commit.png"
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    assert "UI Not Built" not in text
    for key, value in (
        ("perago.workflow_id", wid),
        ("perago.task_ref", "step"),
        ("perago.kind", "publication"),
        ("perago.scope", "data/"),
    ):
        assert key in text and value in text, f"{key}={value} not shown on the commit page"
    assert shot.stat().st_size > 10_000
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):
        shutil.copyfile(shot, ROOT / "docs" / "lakefs-ui-publication.png")
