"""`perago dev`: build, start, stop and describe the local stack."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from perago.errors import PeragoError

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The local stack: lakeFS and Conductor as processes on 127.0.0.1 (no Docker).",
)

T = TypeVar("T")


def _run(action: Callable[[], T]) -> T:
    """Perago errors become one red message on stderr and exit status 1, no traceback."""
    try:
        return action()
    except PeragoError as e:
        typer.secho(f"error: {e.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


@app.command("build")
def build_cmd(
    helm: Annotated[
        bool,
        typer.Option("--helm", help="Also build Helm (for the worker chart's tests)."),
    ] = False,
    k8s: Annotated[
        bool,
        typer.Option(
            "--k8s",
            help="Also build the Kubernetes control plane and KWOK (for `make test-k8s`).",
        ),
    ] = False,
    webui: Annotated[
        bool,
        typer.Option(
            "--webui/--no-webui",
            help="Embed lakeFS's web UI, built with npm from the pinned module's lockfile.",
        ),
    ] = True,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="'production' also builds its S3 server and checks for PostgreSQL.",
        ),
    ] = None,
) -> None:
    """Build lakeFS/lakectl and fetch Conductor if their pins changed (idempotent)."""
    from perago_dev.build import build
    from perago_dev.paths import stack_paths
    from perago_dev.stack import resolve_profile

    production = _run(lambda: resolve_profile(profile)) == "production"
    _run(lambda: build(progress=True, helm=helm, webui=webui, production=production, k8s=k8s))
    typer.echo(f"stack binaries are ready in {_run(stack_paths).stack}", err=True)


@app.command("settings-doc")
def settings_doc_cmd(
    check: Annotated[
        bool, typer.Option("--check", help="Only check; exit status 1 if it is out of date.")
    ] = False,
) -> None:
    """Regenerate docs/settings.md from the Settings model (perago/config.py)."""
    from perago_dev import settings_doc

    path = _run(settings_doc.default_path)
    if check:
        if not settings_doc.check(path):
            typer.secho(
                f"{path} is out of date: run `{settings_doc.COMMAND}`",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(1)
        typer.echo(f"{path} is up to date", err=True)
        return
    path.write_text(settings_doc.render())
    typer.echo(f"wrote {path}", err=True)


@app.command("up")
def up_cmd(
    spark: Annotated[
        bool,
        typer.Option(
            "--spark",
            help="Also a Spark cluster: standalone master, two workers, a Spark Connect server.",
        ),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="embedded (default: local KV, local blockstore, SQLite) or production "
            "(PostgreSQL under lakeFS and Conductor, lakeFS's objects on an S3 server); "
            "default from PERAGO_STACK_PROFILE.",
        ),
    ] = None,
    webui: Annotated[
        bool,
        typer.Option(
            "--webui/--no-webui",
            help="On a first build, embed lakeFS's web UI (npm, about 100 s); --no-webui skips it.",
        ),
    ] = True,
) -> None:
    """Start lakeFS and Conductor (a running stack is reused) and wait until they answer.

    Ports: PERAGO_LAKEFS_PORT (18000), PERAGO_CONDUCTOR_PORT (18080), and on the production
    profile PERAGO_POSTGRES_PORT (18432) and PERAGO_S3_PORT (18900); a running stack keeps
    its ports until `perago dev down`. State: PERAGO_STACK_DIR (docs/local-stack.md).
    """
    from perago_dev import spark_cluster, stack

    started = time.monotonic()
    info = _run(lambda: stack.up(progress=True, profile=profile, webui=webui))
    cluster = _run(lambda: spark_cluster.up(progress=True)) if spark else None
    elapsed = time.monotonic() - started
    typer.echo(f"{info.profile} stack ready in {elapsed:.1f}s ({info.stack_dir})", err=True)
    typer.echo(f"lakeFS     {info.lakefs_endpoint}")
    typer.echo(f"Conductor  {info.conductor_url}")
    if cluster is not None:
        typer.echo(f"Spark      {cluster.master_url} (standalone, 2 workers)")
        typer.echo(f"Connect    {cluster.connect_url}")
    typer.echo('use it from a shell: eval "$(perago dev env)"', err=True)


@app.command("down")
def down_cmd(
    wipe: Annotated[
        bool, typer.Option("--wipe", help="Also delete the servers' data (keeps binaries).")
    ] = False,
    spark: Annotated[
        bool, typer.Option("--spark", help="Stop only the Spark cluster (`up --spark`).")
    ] = False,
) -> None:
    """Stop the processes `perago dev up` started."""
    from perago_dev import spark_cluster, stack

    stopped = _run(spark_cluster.down)
    if not spark:
        stopped += _run(lambda: stack.down(wipe=wipe))
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    if wipe:
        typer.echo("data deleted")


@app.command("status")
def status_cmd() -> None:
    """What runs where; exit status 3 unless everything runs and answers."""
    from perago_dev import stack

    states = _run(stack.status)
    for s in states.values():
        state = ("healthy" if s.healthy else "unhealthy") if s.running else "stopped"
        pid = str(s.pid) if s.pid is not None else "-"
        typer.echo(f"{s.name:<10} {state:<9} pid={pid:<8} {s.url}")
    if not all(s.healthy for s in states.values()):
        raise typer.Exit(3)


@app.command("image")
def image_cmd(
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Then run its entrypoint in a chroot against the running stack.",
        ),
    ] = True,
) -> None:
    """Build the worker image without a registry, as root (an OCI archive); check it."""
    from perago_dev import image, stack

    built = _run(lambda: image.build(progress=True))
    typer.echo(f"image {built.name}: {built.archive} (root filesystem {built.rootfs})")
    if check:  # on the running stack, else the one PERAGO_STACK_PROFILE names
        env = _run(lambda: stack.up(progress=True)).env()
        _run(lambda: image.check(built, env))


def _single_quoted(value: str) -> str:
    """POSIX shell single quotes, always (``shlex.quote`` leaves plain words bare)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


@app.command("env")
def env_cmd() -> None:
    """Print export lines: `eval "$(perago dev env)"`, then lakectl and perago just work."""
    from perago_dev import spark_cluster, stack

    info = _run(stack.info)
    cluster = spark_cluster.cluster()
    for key, value in {**info.env(), **(cluster.env() if cluster else {})}.items():
        typer.echo(f"export {key}={_single_quoted(value)}")
    typer.echo(f'export PATH={_single_quoted(str(info.lakectl.parent))}:"$PATH"')
    if sys.stdout.isatty():
        typer.echo('# apply with: eval "$(perago dev env)"', err=True)
