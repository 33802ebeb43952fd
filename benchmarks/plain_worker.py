"""The peer a user would pick instead of Perago: a plain Conductor worker writing to lakeFS.

Written as a user would write it with conductor-python and lakefs-sdk, and nothing of
Perago's: poll; create a branch at the input ref; upload the partition's files; commit;
merge into the target, retrying what lakeFS answers 409/412/423/429; delete the branch;
report COMPLETED. No fences, leases, scope markers, hooks or read-backs: the fan-out
benchmark's ratio against it is the price of Perago's guarantees.

    python -m benchmarks.plain_worker TASK_NAME THREADS

Configured as each client documents: CONDUCTOR_SERVER_URL (conductor-python) and
LAKECTL_SERVER_ENDPOINT_URL, LAKECTL_CREDENTIALS_ACCESS_KEY_ID and
LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY (lakeFS's), which ``perago dev env`` prints.
"""

# No `from __future__ import annotations`: conductor-python passes the Task only to a
# function whose parameter's annotation *is* the Task class.
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import lakefs_sdk
from conductor.client.automator.task_handler import TaskHandler
from conductor.client.configuration.configuration import Configuration
from conductor.client.http.models.task import Task
from conductor.client.worker.worker import Worker
from lakefs_sdk.exceptions import ApiException

FILES, SIZE = 5, 1024
RETRIED = {409, 412, 423, 429}


def _lakefs() -> lakefs_sdk.ApiClient:
    config = lakefs_sdk.Configuration(
        host=os.environ["LAKECTL_SERVER_ENDPOINT_URL"].rstrip("/") + "/api/v1",
        username=os.environ["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"],
        password=os.environ["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"],
    )
    return lakefs_sdk.ApiClient(config)


_client: lakefs_sdk.ApiClient | None = None


def write_part(task: Task) -> dict[str, Any]:
    """One partition: 5 x 1 KiB under ``parts/p=<part>/``, merged into the workspace's branch."""
    global _client
    if _client is None:  # one client (and connection pool) per worker process
        _client = _lakefs()
    branches = lakefs_sdk.BranchesApi(_client)
    objects = lakefs_sdk.ObjectsApi(_client)
    commits = lakefs_sdk.CommitsApi(_client)
    refs = lakefs_sdk.RefsApi(_client)
    ws, part = task.input_data["workspace"], task.input_data["params"]["part"]
    repo, target = ws["repository"], ws["branch"]
    branch = f"plain-{part}-{uuid.uuid4().hex[:8]}"
    branches.create_branch(repo, lakefs_sdk.BranchCreation(name=branch, source=ws["ref"]))
    with tempfile.TemporaryDirectory() as out:  # the body writes files; the SDK uploads paths
        for i in range(FILES):
            path = Path(out, f"f{i}.bin")
            path.write_bytes(os.urandom(SIZE))
            objects.upload_object(repo, branch, f"parts/p={part}/{path.name}", content=str(path))
    commits.commit(repo, branch, lakefs_sdk.CommitCreation(message=f"part {part}"))
    for attempt in range(30):
        try:
            refs.merge_into_branch(
                repo, branch, target, merge=lakefs_sdk.Merge(message=f"merge part {part}")
            )
            break
        except ApiException as e:
            if e.status not in RETRIED or attempt == 29:
                raise
            time.sleep(min(0.05 * 2**attempt, 2.0))
    branches.delete_branch(repo, branch)
    return {"files": FILES}


def main(argv: list[str]) -> int:
    name, threads = argv[0], int(argv[1])
    config = Configuration(server_api_url=os.environ["CONDUCTOR_SERVER_URL"])
    worker = Worker(name, write_part, poll_interval=100, thread_count=threads)
    handler = TaskHandler(workers=[worker], configuration=config, scan_for_annotated_workers=False)
    handler.start_processes()
    handler.join_processes()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
