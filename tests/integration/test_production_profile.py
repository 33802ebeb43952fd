"""On the production profile (`make test-production`): a workflow's bytes move between the
worker and the S3 server through pre-signed URLs, never through lakeFS.

Proof from the S3 server's own access log (versitygw's, `.stack/logs/s3-access.log`): every
data object the workflow published was PUT, and read back, with a pre-signed query string by
the worker's client, not with lakeFS's signed header and SDK. On the embedded profile these
tests skip: lakeFS's local blockstore cannot pre-sign.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from perago.adapters.conductor import ConductorClient
from perago.adapters.lakefs import LakeFSStore

from .harness import one_step, start, wait_workflow, worker

pytestmark = pytest.mark.integration

# versitygw's access log line: ... s3_<Action> <key> <request-uri> <status> ... <user agent> ...
# (its auth column says AuthHeader for query-string signatures too: the URI tells them apart)
_LINE = re.compile(r" s3_(?P<action>\w+) (?P<key>\S+) (?P<uri>\S+) (?P<status>\d{3}) ")


@pytest.fixture
def access_log(stack_env: dict[str, str]) -> Path:
    from perago_dev.stack import info

    here = info()
    if here.profile != "production":
        pytest.skip("the production profile's test: run `make test-production`")
    return here.stack_dir / "logs" / "s3-access.log"


def _requests(log: Path, keys: set[str]) -> list[tuple[str, str, str, str]]:
    """(action, key, status, who) of every logged request for one of ``keys``; who is
    ``presigned`` (a signature in the query string, lakeFS's SDK absent), ``lakefs`` (lakeFS's
    own SDK) or ``other``."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        m = _LINE.search(line)
        if m and m["key"] in keys:
            if " lakefs/v" in line:
                who = "lakefs"
            elif "X-Amz-Signature=" in m["uri"]:
                who = "presigned"
            else:
                who = "other"
            found.append((m["action"], m["key"], m["status"], who))
    return found


def test_a_workflow_s_bytes_go_straight_between_the_worker_and_s3(
    make_env: Callable[..., dict[str, str]],
    conductor: ConductorClient,
    store: LakeFSStore,
    repo: str,
    unique: str,
    tmp_path: Path,
    access_log: Path,
) -> None:
    files = {"a.txt": "alpha " * 1000, "d/b.txt": "beta", "d/e/c.txt": "gamma " * 50_000}
    write = one_step(conductor, f"pp_wf_write_{unique}", f"pt_write_{unique}", {"files": files})
    read = one_step(conductor, f"pp_wf_read_{unique}", f"pt_read_{unique}", {"require": files})
    env = make_env()
    with worker(env, tmp_path / "w.log"):
        wf = wait_workflow(conductor, start(conductor, write, repo))
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    ref = wf["output"]["workspace"]["ref"]
    # Another worker (its own content cache, which has not seen these bytes) reads them.
    with worker({**env, "PERAGO_WORK_DIR": str(tmp_path / "reader")}, tmp_path / "r.log"):
        again = wait_workflow(conductor, start(conductor, read, repo, ref=ref))
    assert again["status"] == "COMPLETED", again.get("reasonForIncompletion")

    published = list(store.list_objects(repo, ref, "data/"))
    assert {o.path for o in published} == {f"data/{rel}" for rel in files}
    prefix = "s3://perago-data/"
    assert all(o.physical_address.startswith(prefix) for o in published)
    keys = {o.physical_address[len(prefix) :] for o in published}
    seen = _requests(access_log, keys)
    puts = [r for r in seen if r[0] == "PutObject"]
    gets = [r for r in seen if r[0] == "GetObject"]
    # One PUT per object, by the worker with a pre-signed URL.
    assert sorted(r[1] for r in puts) == sorted(keys)
    assert {(r[2], r[3]) for r in puts} == {("200", "presigned")}
    # Read back by the read step: from S3 too, pre-signed; never by lakeFS on the worker's
    # behalf (its own reads carry its SDK's user agent).
    assert {r[1] for r in gets} == keys
    assert {r[3] for r in gets} == {"presigned"}
