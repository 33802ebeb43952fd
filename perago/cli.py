"""The ``perago`` command. The only place that configures how logs are printed."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import structlog
import typer
from typer.core import TyperGroup

from perago import config as config_module
from perago.errors import ConfigError, PeragoError, WorkflowRunError

if TYPE_CHECKING:
    from perago.adapters.conductor import ConductorClient, WorkflowRun
    from perago.publish.history import PublicationRecord


class _Commands(TyperGroup):
    """The one error path of every command: a Perago error (whatever its kind, each message
    says what to do) becomes one red line on stderr and exit status 1, no traceback."""

    def invoke(self, ctx: Any) -> Any:  # typer.Context, a click context
        try:
            return super().invoke(ctx)
        except PeragoError as e:
            typer.secho(f"error: {e.message}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Commands,
    no_args_is_help=True,
    add_completion=False,
    help="Perago: typed Conductor workers that publish to lakeFS with Try/Confirm/Cancel.",
)


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: Set by ``perago -v``; otherwise PERAGO_LOG_LEVEL, otherwise info.
_verbose = False


def _level_from_env(variable: str = "PERAGO_LOG_LEVEL", default: str = "info") -> int:
    import os

    name = os.environ.get(variable, default).strip().lower()
    if name not in _LEVELS:
        raise typer.BadParameter(
            f"{variable}={name!r}: use one of {', '.join(_LEVELS)}", param_hint="env"
        )
    return _LEVELS[name]


def configure_logging(
    *, json_logs: bool | None = None, level: int | None = None, libraries: int | None = None
) -> None:
    """One pipeline: structlog events and stdlib records (the SDKs, urllib3, py4j) rendered
    alike, JSON lines when stderr is no terminal (pods), readable lines in a terminal.

    ``level`` (``PERAGO_LOG_LEVEL``, ``-v``) is Perago's own; the libraries' records pass from
    ``libraries`` up (``PERAGO_LOG_LEVEL_LIBRARIES``, default warning): Perago's debug is not
    py4j's thousands of lines."""
    if level is None:
        level = logging.DEBUG if _verbose else _level_from_env()
    if libraries is None:
        libraries = _level_from_env("PERAGO_LOG_LEVEL_LIBRARIES", "warning")
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # stdlib records go through the same processors and renderer: Perago's own at its level,
    # the libraries' at theirs.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(libraries)
    logging.getLogger("perago").setLevel(level)
    logging.captureWarnings(True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perago-runtime")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"perago {_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Debug logs (PERAGO_LOG_LEVEL otherwise).")
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print Perago's version and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """Perago: typed Conductor workers that publish to lakeFS with Try/Confirm/Cancel."""
    global _verbose
    _verbose = verbose
    configure_logging()  # once, for every command


#: `perago run --wait` exit codes (README, "Using it"); 1 is any other error, 2 a usage error.
EXIT_FAILED = 3  # FAILED or FAILED_WITH_TERMINAL_ERROR
EXIT_TIMED_OUT = 4  # Conductor timed the workflow out (its timeoutSeconds)
EXIT_TERMINATED = 5  # terminated by someone (perago, the UI, the API)
EXIT_WAIT_TIMEOUT = 6  # still running when --timeout ran out (the workflow goes on)
EXIT_PAUSED = 7
_EXIT_BY_STATUS = {
    "TIMED_OUT": EXIT_TIMED_OUT,
    "TERMINATED": EXIT_TERMINATED,
    "PAUSED": EXIT_PAUSED,
}


class _WaitTimeout(WorkflowRunError):
    pass


@app.command()
def register(
    modules: Annotated[list[str], typer.Argument(help="Modules defining @task functions.")],
    workflows: Annotated[
        Path | None, typer.Option("--workflows", help="Directory of workflow JSON files.")
    ] = None,
    schemas: Annotated[
        bool,
        typer.Option(
            "--schemas",
            help="Store each task's input and output JSON schema with its definition, for "
            "Conductor's UI. Conductor copies the definition into every task it schedules, so "
            "wide fan-outs run slower with them.",
        ),
    ] = False,
) -> None:
    """Register every @task in MODULES, then every workflow JSON in --workflows (idempotent)."""
    from perago import wiring
    from perago.conductor.registry import discover, load_workflows
    from perago.conductor.registry import register as do_register

    settings = config_module.load()
    tasks = discover(modules)
    wfs = load_workflows(workflows) if workflows else []
    warnings = do_register(
        wiring.conductor_client(settings),
        tasks,
        wfs,
        params_extra=settings.params_extra,
        schemas=schemas,
    )
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(
        f"registered {len(tasks)} task(s): {', '.join(t.name for t in tasks)}"
        + (f"; {len(wfs)} workflow(s): {', '.join(w['name'] for w in wfs)}" if wfs else "")
    )


@app.command()
def worker(
    modules: Annotated[list[str], typer.Argument(help="Modules defining @task functions.")],
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Attempts run at once.")
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option("--http-port", min=0, help="Serve /healthz, /readyz and /metrics here."),
    ] = None,
) -> None:
    """Run a worker for every @task in MODULES until SIGTERM (drains gracefully)."""
    from perago import wiring
    from perago.conductor.registry import discover

    overrides: dict[str, Any] = {}
    if concurrency is not None:
        overrides["concurrency"] = concurrency
    settings = config_module.load(**overrides)
    tasks = discover(modules)
    spark = wiring.spark_sessions(settings, tasks)
    with wiring.services(settings) as parts:
        w = wiring.worker(settings, tasks, parts, spark=spark, http_port=http_port)
        try:
            w.run()
        finally:
            if spark is not None:
                spark.stop()


def _parse_input(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkflowRunError(
            f"--input is not valid JSON ({e}); pass a JSON object or @file"
        ) from e
    if not isinstance(value, dict):
        raise WorkflowRunError("--input must be a JSON object")
    return value


def _wait_for_workflow(
    conductor: ConductorClient, workflow: str, workflow_id: str, timeout: float
) -> WorkflowRun:
    """Poll until the workflow ends; a spinner with the finished steps when on a terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    deadline = time.monotonic() + timeout
    with console.status(f"{workflow} {workflow_id}: starting") as spinner:
        while True:
            wf = conductor.workflow_run(workflow_id)
            if wf.ended:
                return wf
            if time.monotonic() > deadline:
                raise _WaitTimeout(
                    f"workflow {workflow} ({workflow_id}) is still {wf.status} after "
                    f"{timeout:.0f}s; is a worker running for its tasks? (perago worker MODULE...)"
                )
            if console.is_terminal:
                spinner.update(f"{workflow} {workflow_id}: {' '.join(wf.steps) or wf.status}")
            time.sleep(0.5)


def _parse_domains(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        task_name, sep, domain = pair.partition("=")
        if not sep or not task_name or not domain:
            raise ConfigError(
                f"--domain {pair!r}: write TASK=DOMAIN, e.g. --domain orders_clean=blue"
            )
        out[task_name] = domain
    return out


@app.command()
def run(
    workflow: Annotated[str, typer.Argument(help="Registered workflow name.")],
    input_: Annotated[
        str | None, typer.Option("--input", help="Workflow input: JSON or @file.json.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the end; print the output.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 600.0,
    version: Annotated[int | None, typer.Option("--version", help="Workflow version.")] = None,
    domain: Annotated[
        list[str] | None,
        typer.Option(
            "--domain",
            help="TASK=DOMAIN: run TASK's steps on workers of that Conductor task domain "
            "(repeatable; TASK may be * for all).",
        ),
    ] = None,
    recompute: Annotated[
        bool,
        typer.Option(
            "--recompute",
            help="Run incremental steps even where they could reuse an earlier publication "
            '(adds "recompute": true to the workflow input; steps read '
            '"${workflow.input.recompute}").',
        ),
    ] = False,
) -> None:
    """Start WORKFLOW; with --wait print its output JSON and exit 0 only if it COMPLETED
    (3 failed, 4 timed out by Conductor, 5 terminated, 6 --timeout ran out, 7 paused)."""
    from perago import wiring

    try:
        settings = config_module.load()
        conductor = wiring.conductor_client(settings)
        workflow_input = _parse_input(input_)
        if recompute:
            workflow_input["recompute"] = True
        workflow_id = conductor.start_workflow(
            workflow,
            workflow_input,
            version=version,
            task_to_domain=_parse_domains(domain or []),
        )
        if not wait:
            typer.echo(workflow_id)
            return
        typer.echo(f"started workflow {workflow} ({workflow_id})", err=True)
        wf = _wait_for_workflow(conductor, workflow, workflow_id, timeout)
    except _WaitTimeout as e:
        typer.secho(f"error: {e.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_WAIT_TIMEOUT) from e
    if not wf.completed:
        typer.secho(
            f"workflow {workflow} ({workflow_id}) {wf.status}: {wf.failure}",
            fg=typer.colors.RED,
            err=True,
        )
        if wf.failed_task_id:
            typer.echo(
                "the failed attempt's traceback: Conductor's task log (UI: the task's Logs "
                f"tab; API: GET {settings.conductor_server_url.rstrip('/')}/tasks/"
                f"{wf.failed_task_id}/log) and the worker's log (event attempt_failed, field "
                "traceback)",
                err=True,
            )
        raise typer.Exit(_EXIT_BY_STATUS.get(wf.status, EXIT_FAILED))
    typer.secho(f"workflow {workflow} ({workflow_id}) COMPLETED", err=True)
    if wf.reused:
        typer.echo(
            f"{len(wf.ran)} step(s) ran; {len(wf.reused)} reused an earlier publication "
            f"(same inputs, params and code): {', '.join(wf.reused)}",
            err=True,
        )
    typer.echo(json.dumps(wf.output, indent=2))


def _split_target(target: str) -> tuple[str, str | None]:
    repository, _, branch = target.removeprefix("lakefs://").partition("/")
    if not repository:
        raise ConfigError(f"{target!r}: name a repository, e.g. `perago log demo/main`")
    return repository, branch or None


def _short(location: str, repository: str) -> str:
    """``prefix @commit12`` (``repository:prefix @commit12`` from another repository)."""
    source, _, rest = location.partition("@")
    commit, _, prefix = rest.partition("/")
    where = prefix if source == repository else f"{source}:{prefix}"
    return f"{where} @{commit[:12]}"


@app.command("log")
def log_(
    target: Annotated[
        str,
        typer.Argument(
            help="REPOSITORY or REPOSITORY/BRANCH (lakefs:// optional); default branch main."
        ),
    ],
    amount: Annotated[
        int, typer.Option("--amount", "-n", min=1, help="How many commits to look back.")
    ] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array, for scripts.")] = False,
    links: Annotated[
        bool,
        typer.Option(
            "--links", help="Also the commit in the lakeFS UI and the workflow in Conductor."
        ),
    ] = False,
) -> None:
    """Perago's publications on a branch: workflow, step, attempt, scope, the inputs it read
    (each at its commit), fencing token; with --links the commit in the lakeFS UI and the
    workflow in Conductor's API (--json has everything)."""
    from perago import wiring
    from perago.publish.history import branch_publications

    repository, branch = _split_target(target)
    settings = config_module.load()
    settings.require_lakefs_credentials()
    store = wiring.lakefs_store(settings)
    try:
        records = branch_publications(
            store,
            repository,
            branch or "main",
            amount=amount,
            lakefs_ui=settings.lakefs_endpoint,
            conductor_api=settings.conductor_server_url,
        )
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps([r.as_json() for r in records], indent=2))
        return
    if not records:
        typer.echo(
            f"no Perago publication in the last {amount} commits of {repository}/{branch or 'main'}"
        )
        return
    typer.echo(f"{repository}/{branch or 'main'}: Perago publications, newest first\n")
    for r in records:
        typer.echo("\n".join(_publication_lines(r, repository, links=links)) + "\n")


#: Inputs `perago log` lists per publication (`--json` lists all).
_SHOWN_INPUTS = 8


def _publication_lines(r: PublicationRecord, repository: str, *, links: bool) -> list[str]:
    """One publication as a block of short lines (readable at 100 columns)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created)) if r.created else "?"
    head = (
        f"{r.commit[:12]}  {when}  {r.kind}  {r.step} (retry {r.retry_count}, poll {r.poll_count})"
    )
    if r.fencing_token:
        head += f"  token {r.fencing_token}"
    lines = [head, f"  workflow   {r.workflow_id}"]
    if r.scope:
        lines.append(f"  scope      {r.scope}")
    names = list(r.inputs)
    width = max((len(n) for n in names[:_SHOWN_INPUTS]), default=0)
    for i, name in enumerate(names[:_SHOWN_INPUTS]):
        label = "  inputs     " if i == 0 else " " * 13
        lines.append(f"{label}{name.ljust(width)} = {_short(r.inputs[name], repository)}")
    if len(names) > _SHOWN_INPUTS:
        lines.append(f"{' ' * 13}... and {len(names) - _SHOWN_INPUTS} more (--json lists all)")
    if links:
        lines += [f"  lakeFS     {r.lakefs_url}", f"  Conductor  {r.conductor_url}"]
    return lines


@app.command()
def janitor(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report, remove nothing.")] = False,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Only attempts over for this long (90s, 10m, 2h).")
    ] = "0s",
    repository: Annotated[
        list[str] | None, typer.Option("--repository", help="Only these repositories.")
    ] = None,
    branch_pattern: Annotated[
        str | None,
        typer.Option(
            "--branch-pattern",
            help="Only staging branches matching this glob (the cluster's own, named after "
            "PERAGO_CLUSTER_ID, are the only ones ever considered).",
        ),
    ] = None,
    lease_watch: Annotated[
        str | None,
        typer.Option(
            "--lease-watch",
            help="Watch held leases this long before calling them expired (default: the "
            "takeover time, lease ttl x clock-skew rate; 0s removes only released ones).",
        ),
    ] = None,
) -> None:
    """Remove staging branches of attempts that are over or unknown to Conductor, and expired
    branch leases."""
    from perago import wiring
    from perago.publish.janitor import parse_duration, sweep, sweep_leases, takeover_watch

    settings = config_module.load()
    with wiring.services(settings) as parts:
        repositories = repository or parts.store.list_repositories()
        report = sweep(
            parts.store,
            parts.conductor,
            repositories=repositories,
            dry_run=dry_run,
            older_than=parse_duration(older_than),
            cluster_id=settings.cluster_id,
            branch_pattern=branch_pattern,
            keep_wap=settings.wap_keep_branch,
        )
        watch = parse_duration(lease_watch) if lease_watch is not None else takeover_watch(settings)
        lease_report = (
            sweep_leases(parts.leases, repositories=repositories, dry_run=dry_run, watch=watch)
            if parts.leases is not None
            else None
        )
    verb = "would remove" if dry_run else "removed"
    for repo, branch, reason in report.removed:
        typer.echo(f"{verb} {repo}/{branch}: {reason}")
    typer.echo(f"{verb} {len(report.removed)} staging branch(es); kept {len(report.kept)}")
    if lease_report is not None:
        for _, name, reason in lease_report.removed:
            typer.echo(f"{verb} lease {name}: {reason}")
        for _, name, reason in lease_report.kept:
            typer.echo(f"kept lease {name}: {reason}")
        typer.echo(
            f"{verb} {len(lease_report.removed)} lease(s); kept {len(lease_report.kept)} held"
        )


repo_app = typer.Typer(no_args_is_help=True, help="Prepare lakeFS repositories for Perago.")


@repo_app.command("init")
def repo_init(
    repository: Annotated[str, typer.Argument(help="lakeFS repository.")],
    branch: Annotated[str, typer.Option("--branch", help="Target branch to protect.")] = "main",
    create: Annotated[
        bool, typer.Option("--create", help="Create the repository if it does not exist.")
    ] = False,
) -> None:
    """Install the expected-head pre-merge hook on BRANCH (idempotent)."""
    from perago import wiring
    from perago.publish.expected_head_hook import install

    store = wiring.lakefs_store(config_module.load())
    if create and not store.repository_exists(repository):
        store.create_repository(repository, default_branch=branch)
    commit = install(store, repository, branch)
    if commit is None:
        typer.echo(f"{repository}/{branch}: the expected-head hook is already installed")
    else:
        typer.echo(f"{repository}/{branch}: installed the expected-head hook in {commit}")


def _mount_subcommands() -> None:
    """``repo``, and the commands installed distributions add (entry points ``perago.cli``:
    ``perago dev`` comes with perago-dev, the local stack, which the runtime does not carry)."""
    from importlib.metadata import entry_points

    app.add_typer(repo_app, name="repo")
    plugins = {ep.name: ep for ep in entry_points(group="perago.cli")}
    if "dev" in plugins:
        app.add_typer(plugins["dev"].load(), name="dev", help="The local lakeFS + Conductor stack.")
        return

    @app.command(
        "dev",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help="The local lakeFS + Conductor stack (needs perago-dev).",
    )
    def dev_missing() -> None:
        typer.echo(
            "error: `perago dev` (the local stack) comes with the perago-dev distribution, "
            "which is not installed: pip install <your Perago checkout>/perago-dev "
            "(make install does it in a checkout)",
            err=True,
        )
        raise typer.Exit(2)


def main() -> None:
    _mount_subcommands()
    app()
