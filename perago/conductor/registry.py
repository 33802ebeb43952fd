"""Find task definitions in modules and register them (and workflows) with Conductor."""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perago._api.task import TaskDefinition
from perago.adapters.conductor import (
    ConductorClient,
    worker_tasks,
    workflow_def_defaults,
    workflow_steps,
)
from perago.conductor.workflow_check import fork_retry_warnings, workflow_problems
from perago.errors import RegistrationError, TaskDefinitionError

__all__ = ["discover", "load_workflows", "register"]


def _looks_like_a_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.endswith(".py")


def _where(e: BaseException, module: str) -> str:
    """``file:line`` of the frame in the user's code closest to the failure ("" if none)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "importlib" not in f.filename and "/perago/" not in f.filename]
    if not ours:
        return ""
    top = module.split(".", 1)[0]
    in_project = [f for f in ours if f"/{top}/" in f.filename or f"/{top}.py" in f.filename]
    frame = (in_project or ours)[-1]
    return f"{frame.filename}:{frame.lineno}"


def _import_error(name: str, e: BaseException) -> RegistrationError:
    """One clear message for a module that cannot be imported: what, where, what to do."""
    where = _where(e, name)
    at = f" ({where})" if where else ""
    if (
        isinstance(e, ModuleNotFoundError)
        and e.name
        and (name == e.name or name.startswith(e.name + "."))
    ):
        if _looks_like_a_path(name):
            dotted = name.removesuffix(".py").replace("/", ".").replace("\\", ".").strip(".")
            return RegistrationError(
                f"{name!r} looks like a file path: pass the module's dotted path importable "
                f"from the current directory instead, e.g. {dotted}"
            )
        return RegistrationError(
            f"no module named {e.name!r} (for {name!r}): run from the folder that holds it "
            "(modules are imported from the current directory), or install its package"
        )
    if isinstance(e, ModuleNotFoundError):
        return RegistrationError(
            f"module {name!r} imports {e.name!r}{at}, which is not installed in this "
            f"environment ({sys.executable}); install it, or fix the import"
        )
    if isinstance(e, ImportError):
        return RegistrationError(
            f"module {name!r} fails to import what it needs{at}: {e}; fix the import (or "
            "install what it names) and run the command again"
        )
    if isinstance(e, SyntaxError):
        text = f": {e.text.strip()}" if e.text else ""
        return RegistrationError(
            f"module {name!r} has a syntax error at {where or '?'}: {e.msg}{text}; fix it and "
            "run the command again"
        )
    if isinstance(e, TaskDefinitionError):
        return RegistrationError(f"module {name!r}{at}: {e.message}")
    return RegistrationError(
        f"importing module {name!r} raised {type(e).__name__}: {e}{at}; fix the module (run "
        f"`python -c 'import {name}'` for the full traceback) and run the command again"
    )


def discover(modules: Sequence[str]) -> list[TaskDefinition[Any, Any]]:
    """Import ``modules`` and return every module-level task definition, in order.

    Any failure to import one (a missing module, a syntax error, an exception at import, a
    bad ``@task``) is one ``RegistrationError`` naming the file and line."""
    if "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules of the current directory
    found: dict[str, TaskDefinition[Any, Any]] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # whatever the module raises: one clear message
            raise _import_error(name, e) from e
        defs = [v for v in vars(module).values() if isinstance(v, TaskDefinition)]
        if not defs:
            raise RegistrationError(f"module {name!r} defines no @task functions")
        for d in defs:
            other = found.get(d.name)
            if other is not None and other.fn is not d.fn:
                raise RegistrationError(f"two different tasks are named {d.name!r}; rename one")
            found[d.name] = d
    return list(found.values())


def load_workflows(directory: Path) -> list[dict[str, Any]]:
    if not directory.is_dir():
        raise RegistrationError(f"workflow directory {directory} does not exist")
    workflows = []
    for path in sorted(directory.glob("*.json")):
        try:
            wf = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise RegistrationError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(wf, dict) or not wf.get("name") or not isinstance(wf.get("tasks"), list):
            raise RegistrationError(
                f"{path} is not a Conductor workflow definition (needs name and tasks)"
            )
        wf = workflow_def_defaults(wf)
        wf["_source"] = str(path)
        workflows.append(wf)
    if not workflows:
        raise RegistrationError(f"no *.json workflow definitions in {directory}")
    return workflows


def register(
    conductor: ConductorClient,
    tasks: Sequence[TaskDefinition[Any, Any]],
    workflows: Sequence[dict[str, Any]] = (),
    *,
    params_extra: str = "forbid",
    schemas: bool = False,
) -> list[str]:
    """Upsert task definitions, then workflows; a workflow naming an unknown task is an error.
    Returns warnings: what the definitions risk without being wrong (a fork of tasks that
    leave their retries to Conductor).

    The built-in write-audit-publish tasks (``perago.wap``) are added when a workflow uses
    them (their workers must still list ``perago.wap`` among their modules). Workflows are
    checked as the workers will run them (``params_extra``: ``PERAGO_PARAMS_EXTRA``). The task
    definitions carry their JSON schemas only with ``schemas`` (``task_def`` says why)."""
    used = {name for wf in workflows for name, _ in worker_tasks(wf["tasks"])}
    given = {t.name for t in tasks}
    from perago import wap

    builtin = [t for t in (wap.perago_wap_begin, wap.perago_wap_publish) if t.name in used]
    tasks = [*tasks, *(t for t in builtin if t.name not in given)]
    if tasks:
        conductor.register_tasks(tasks, schemas=schemas)
    known = {t.name for t in tasks}
    for wf in workflows:
        for name, ref in worker_tasks(wf["tasks"]):
            if name in known:
                continue
            if not conductor.task_def_exists(name):
                raise RegistrationError(
                    f"workflow {wf['name']!r} ({wf.get('_source', '?')}) uses task {name!r} "
                    f"(ref {ref!r}), which is neither in the given modules nor registered in "
                    "Conductor; add its module to `perago register`"
                )
            known.add(name)
    by_name = {t.name: t for t in tasks}
    problems = [
        p
        for wf in workflows
        for p in workflow_problems(workflow_steps(wf), by_name, params_extra=params_extra)
    ]
    if problems:
        raise RegistrationError(
            f"{len(problems)} problem(s) in the workflow definitions; fix them and register "
            "again:\n  " + "\n  ".join(problems)
        )
    if workflows:
        conductor.put_workflow_defs(
            [{k: v for k, v in wf.items() if k != "_source"} for wf in workflows]
        )
    return [w for wf in workflows for w in fork_retry_warnings(workflow_steps(wf), by_name)]
