"""The workflow mix: serial chains, a DO_WHILE loop, read-only steps, failing bodies,
sub-workflows and fan-outs, each on its own target branch."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["KINDS", "WRITE", "definitions", "params_for"]

WRITE, READ, PART = "chaos_write", "chaos_read", "chaos_part"
#: Partitions of a fan-out: one worker's publications of them share lease grants.
FAN_WIDTH = 6
_OWNER = "perago@example.com"
_PINNED = "${workflow.input.workspace}"
_UNPINNED = {
    "repository": "${workflow.input.workspace.repository}",
    "branch": "${workflow.input.workspace.branch}",
}
#: kind -> weight in the mix
KINDS = {"chain": 4, "loop": 2, "read": 2, "fail": 1, "sub": 2, "fan": 2}


def _step(task: str, ref: str, workspace: Any, **params: Any) -> dict[str, Any]:
    return {
        "name": task,
        "taskReferenceName": ref,
        "type": "SIMPLE",
        "inputParameters": {
            "workspace": workspace,
            "params": {"sleep": "${workflow.input.sleep}", **params},
        },
    }


def _out(ref: str) -> str:
    return f"${{{ref}.output.workspace}}"


def _workflow(name: str, tasks: list[dict[str, Any]], last: str) -> dict[str, Any]:
    return {
        "name": name,
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": _OWNER,
        "timeoutSeconds": 3600,
        "inputParameters": ["workspace", "sleep"],
        "tasks": tasks,
        "outputParameters": {"workspace": _out(last)},
    }


def definitions() -> list[dict[str, Any]]:
    chain = _workflow(
        "chaos_chain",
        [
            _step(WRITE, "w1", _PINNED),
            _step(WRITE, "w2", _out("w1")),
            _step(WRITE, "w3", _out("w2")),
        ],
        "w3",
    )
    loop = _workflow(
        "chaos_loop",
        [
            {
                "name": "loop",
                "taskReferenceName": "loop",
                "type": "DO_WHILE",
                "loopCondition": "if ($.loop['iteration'] < 3) { true; } else { false; }",
                "loopOver": [_step(WRITE, "lw", _UNPINNED)],
            },
            _step(READ, "after", _UNPINNED),
        ],
        "after",
    )
    read = _workflow(
        "chaos_read",
        [
            _step(WRITE, "w1", _PINNED),
            _step(READ, "r1", _out("w1")),
            _step(WRITE, "w2", _out("r1")),
        ],
        "w2",
    )
    fail = _workflow(
        "chaos_fail",
        [
            _step(WRITE, "w1", _PINNED, fail_first=True),
            _step(WRITE, "w2", _out("w1"), terminal=True),
        ],
        "w2",
    )
    sub = _workflow(
        "chaos_sub",
        [
            {
                "name": "chaos_chain",
                "taskReferenceName": "sub",
                "type": "SUB_WORKFLOW",
                "subWorkflowParam": {"name": "chaos_chain", "version": 1},
                "inputParameters": {"workspace": _PINNED, "sleep": "${workflow.input.sleep}"},
            },
            _step(WRITE, "w4", _out("sub")),
        ],
        "w4",
    )
    # Each partition a SUB_WORKFLOW: its retries stay inside the child (docs/protocol.md,
    # "Retries inside a fan-out"); the second partition fails its first try.
    part = _workflow(
        "chaos_part_one",
        [
            _step(
                PART,
                "p",
                _PINNED,
                part="${workflow.input.part}",
                fail_first="${workflow.input.fail}",
            )
        ],
        "p",
    )
    part["inputParameters"] = ["workspace", "sleep", "part", "fail"]
    children = [
        [
            {
                "name": "chaos_part_one",
                "taskReferenceName": f"part{i}",
                "type": "SUB_WORKFLOW",
                "subWorkflowParam": {"name": "chaos_part_one", "version": 1},
                "inputParameters": {
                    "workspace": _PINNED,
                    "sleep": "${workflow.input.sleep}",
                    "part": str(i),
                    "fail": i == 1,
                },
            }
        ]
        for i in range(FAN_WIDTH)
    ]
    fan = _workflow(
        "chaos_fan",
        [
            {"name": "fan", "taskReferenceName": "fan", "type": "FORK_JOIN", "forkTasks": children},
            {
                "name": "fan_join",
                "taskReferenceName": "fan_join",
                "type": "JOIN",
                "joinOn": [f"part{i}" for i in range(FAN_WIDTH)],
            },
            _step(READ, "after", _UNPINNED),
        ],
        "after",
    )
    return [chain, loop, read, fail, sub, part, fan]


def params_for(rng: random.Random) -> tuple[str, float]:
    """A workflow kind and its steps' body duration."""
    kinds = list(KINDS)
    kind = rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]
    return f"chaos_{kind}", round(rng.uniform(0.0, 2.0), 2)
