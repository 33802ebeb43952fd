"""Generate ``docs/settings.md`` from the :class:`~perago.config.Settings` model.

The page is derived, never edited by hand: ``perago dev settings-doc`` (or ``python -m
perago_dev.settings_doc``) rewrites it, ``--check`` only compares, and a unit test fails when
it is stale. Defaults are rendered without reading the environment or the machine, and a
secret's default is never printed.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo

from perago.config import Settings
from perago.errors import ConfigError

__all__ = ["COMMAND", "check", "default_path", "env_names", "main", "render"]

#: How to regenerate the page; quoted in the page itself and in the stale-page error.
COMMAND = "perago dev settings-doc"

#: Defaults computed when settings load (from the host, the process or the home folder):
#: described, since their value differs from machine to machine.
_COMPUTED_DEFAULTS = {
    "work_dir": "`$TMPDIR/perago` (usually `/tmp/perago`)",
    "cache_dir": "`$TMPDIR/perago-cache` (usually `/tmp/perago-cache`)",
    "worker_id": "`<hostname>-<pid>`",
    "spark_ivy_dir": "`~/.cache/perago/ivy`",
}


def env_names(name: str, field: FieldInfo) -> list[str]:
    """The variables :func:`perago.config.load` reads for a field, first match wins."""
    names: list[str] = []
    if isinstance(field.validation_alias, AliasChoices):
        names = [a for a in field.validation_alias.choices if isinstance(a, str)]
    own = f"PERAGO_{name.upper()}"
    return names if own in names else [*names, own]


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    if annotation is timedelta:
        kind = "seconds"
    elif annotation is SecretStr:
        kind = "secret string"
    elif annotation is bool:
        kind = "bool"
    elif annotation is Path:
        kind = "path"
    elif isinstance(annotation, type):
        kind = annotation.__name__
    elif typing.get_origin(annotation) in (types.UnionType, typing.Union) and (
        len(args := [a for a in typing.get_args(annotation) if a is not type(None)]) == 1
        and isinstance(args[0], type)
    ):
        kind = args[0].__name__  # optional: its default says what unset means
    else:
        kind = "JSON object"
    bounds = [
        f"{op} {getattr(m, attr)}"
        for m in field.metadata
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if getattr(m, attr, None) is not None
    ]
    return f"{kind} ({', '.join(bounds)})" if bounds else kind


def _default(name: str, field: FieldInfo) -> str:
    if field.annotation is SecretStr:
        return "unset"  # never a value, whatever the model says
    if field.default_factory is not None:
        if name in _COMPUTED_DEFAULTS:
            return _COMPUTED_DEFAULTS[name]
        value: Any = field.default_factory()  # type: ignore[call-arg]
        if value in ({}, []):
            return "empty"
        raise ConfigError(
            f"settings field {name!r} has a computed default: describe it in "
            "perago-dev/perago_dev/settings_doc.py (_COMPUTED_DEFAULTS)"
        )
    value = field.default
    if isinstance(value, timedelta):
        return f"`{value.total_seconds():g}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "" or value is None:
        return "unset"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _coord_options() -> list[str]:
    from perago.coord.factory import OPTIONS

    lines = [
        "| backend | required | optional |",
        "|---|---|---|",
    ]
    for kind, (required, optional) in OPTIONS.items():
        req = ", ".join(f"`PERAGO_COORD_{o.upper()}`" for o in required) or "-"
        opt = ", ".join(f"`PERAGO_COORD_{o.upper()}`" for o in optional) or "-"
        lines.append(f"| `{kind}` | {req} | {opt} |")
    return lines


def render() -> str:
    """The whole page, from the model alone."""
    out = [
        "# Settings",
        "",
        f"<!-- Generated from perago/config.py by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Every setting of a worker (and of the other `perago` commands) comes from the",
        "environment; nothing else is read. Where several variables are listed, the first one",
        "that is set wins: the names lakectl and the Conductor SDK use come first, so a shell",
        'set up for them (`eval "$(perago dev env)"`) needs nothing more. Durations are in',
        "seconds (`0.5`, `30`). Values are checked when a command starts and a wrong one stops it",
        "naming the variable.",
        "",
        "| setting | variables | type | default | description |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        variables = "<br>".join(f"`{v}`" for v in env_names(name, field))
        out.append(
            f"| `{name}` | {variables} | {_cell(_type(field))} | {_cell(_default(name, field))} "
            f"| {_cell(field.description or '')} |"
        )
    out += [
        "",
        "## Coordination backend options",
        "",
        "`PERAGO_COORD_BACKEND` picks the backend; its options are `PERAGO_COORD_<OPTION>`",
        "variables (see `docs/coordination.md`). Unknown options and missing required ones stop",
        "the worker with an error naming them.",
        "",
        *_coord_options(),
        "",
        "## Credentials",
        "",
        "`LAKECTL_CREDENTIALS_ACCESS_KEY_ID` and `LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY` (and",
        "`CONDUCTOR_AUTH_KEY` / `CONDUCTOR_AUTH_SECRET` for a Conductor that wants them) are",
        "credentials: the Helm chart takes them from a Secret, never from its ConfigMap",
        "(`docs/operations.md`). Perago never logs them.",
        "",
        "## Conductor auth and task domains",
        "",
        "With `CONDUCTOR_AUTH_KEY` and `CONDUCTOR_AUTH_SECRET` set, every Conductor call (polls,",
        "updates, registration, `perago run`) carries an `X-Authorization` token, minted by",
        "`POST /api/token` as conductor-python does, renewed after 45 minutes and at once when",
        "the server answers `EXPIRED_TOKEN` or `INVALID_TOKEN` (the call is then sent again once).",
        "A server without `/api/token` (Conductor OSS) runs open: a warning",
        "`conductor_auth_not_offered` is logged. A refused call fails with a message naming the",
        "two variables.",
        "",
        "A worker polls each task in one task domain: `PERAGO_TASK_DOMAINS` (per task name), else",
        "the task's `@task(domain=...)`, else `CONDUCTOR_WORKER_DOMAIN`, else none (the default",
        "queue). A workflow is routed to domains when started: `perago run WF --domain",
        "TASK=DOMAIN` (Conductor's `taskToDomain`).",
        "",
    ]
    return "\n".join(out)


def default_path() -> Path:
    """``docs/settings.md`` of the checkout."""
    from perago.errors import StackError
    from perago_dev.paths import find_project_root

    root = find_project_root()
    if root is None:
        raise StackError("docs/settings.md is generated in a Perago checkout; run it from one")
    return root / "docs" / "settings.md"


def check(path: Path) -> bool:
    """Whether ``path`` holds exactly what :func:`render` makes."""
    return path.is_file() and path.read_text() == render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perago_dev.settings_doc", description="Regenerate docs/settings.md."
    )
    parser.add_argument("--check", action="store_true", help="only report whether it is current")
    parser.add_argument("--path", type=Path, default=None, help="the page (docs/settings.md)")
    args = parser.parse_args(argv)
    path: Path = args.path or default_path()
    if args.check:
        if check(path):
            return 0
        print(f"{path} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    path.write_text(render())
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
