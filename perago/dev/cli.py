"""`perago dev`: build, start, stop and describe the local stack."""

from __future__ import annotations

import shlex
import time
from typing import Annotated

import typer

from perago.errors import PeragoError

app = typer.Typer(no_args_is_help=True, help="The local lakeFS + Conductor stack.")


def _fail(e: PeragoError) -> typer.Exit:
    typer.secho(f"error: {e.message}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


@app.command("build")
def build_cmd() -> None:
    """Build lakeFS/lakectl (Go module proxy) and fetch Conductor (Maven Central) if needed."""
    from perago.dev.build import build

    try:
        paths = build(progress=True)
    except PeragoError as e:
        raise _fail(e) from e
    typer.echo(f"stack binaries ready in {paths.stack}")


@app.command("up")
def up_cmd() -> None:
    """Start lakeFS and Conductor on 127.0.0.1 (a running stack is reused)."""
    from perago.dev import stack

    try:
        before = {k: v.running for k, v in stack.status().items()}
        started = time.monotonic()
        info = stack.up(progress=True)
    except PeragoError as e:
        raise _fail(e) from e
    if all(before.values()):
        typer.echo("the stack is already running")
    else:
        typer.echo(f"stack up in {time.monotonic() - started:.1f}s")
    typer.echo(f"lakeFS    {info.lakefs_endpoint}\nConductor {info.conductor_url}")
    typer.echo('use it from a shell: eval "$(perago dev env)"')


@app.command("down")
def down_cmd(
    wipe: Annotated[bool, typer.Option("--wipe", help="Also delete the stack's data.")] = False,
) -> None:
    """Stop the processes `perago dev up` started."""
    from perago.dev import stack

    try:
        stopped = stack.down(wipe=wipe)
    except PeragoError as e:
        raise _fail(e) from e
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command("status")
def status_cmd() -> None:
    """Say what runs where."""
    from perago.dev import stack

    try:
        states = stack.status()
    except PeragoError as e:
        raise _fail(e) from e
    for s in states.values():
        state = ("healthy" if s.healthy else "starting") if s.running else "stopped"
        typer.echo(f"{s.name:<10} {state:<8} pid={s.pid or '-':<8} {s.url}")
    if not all(s.running for s in states.values()):
        raise typer.Exit(3)


@app.command("env")
def env_cmd() -> None:
    """Print export lines: eval "$(perago dev env)" then lakectl and perago just work."""
    from perago.dev import stack

    try:
        info = stack.info()
    except PeragoError as e:
        raise _fail(e) from e
    for key, value in info.env().items():
        typer.echo(f"export {key}={shlex.quote(value)}")
    typer.echo(f'export PATH={shlex.quote(str(info.lakectl.parent))}:"$PATH"')
