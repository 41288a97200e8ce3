"""The `spotrun` command line: thin commands that parse options and call one core function.

Heavy libraries (torch, libcloud, paramiko, textual, the etcd client) are imported inside the
core functions, never here, so `spotrun --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from spotrun import __version__
from spotrun.errors import EXIT_CODES, RecipeError, SpotrunError

_EPILOG = "Exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()) + "."

app = typer.Typer(
    name="spotrun",
    help="Train ML models on spot VMs: cheapest offers, elastic torchrun through preemptions, true cost.",
    epilog=_EPILOG,
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
etcd_app = typer.Typer(
    help="The embedded control plane: a single-node etcd under $SPOTRUN_HOME that outlives spotrun.",
    no_args_is_help=True,
)
app.add_typer(etcd_app, name="etcd")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"spotrun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log lines on stderr (-vv for debug).")] = 0,
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
) -> None:
    """Train ML models on spot VMs."""
    from spotrun import log

    log.setup(verbose)


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Recipe files to check.", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")] = False,
) -> None:
    """Check recipe files: one line per problem as FILE:LINE:COL: field: message (hint).

    Exits 0 when every file is valid, 3 when any is not.
    """
    from spotrun import console
    from spotrun.recipe import check_files

    checks = check_files(files)
    for check in checks:
        for problem in check.problems:
            console.err.print(problem, markup=False)
    if json_out:
        console.print_json(
            [{"file": str(c.path), "valid": c.ok, "name": c.recipe.name if c.recipe else None, "problems": c.problems} for c in checks]
        )
    else:
        for check in checks:
            if check.ok:
                console.out.print(f"{check.path}: ok (recipe {check.recipe.name})", markup=False)
    if not all(c.ok for c in checks):
        raise typer.Exit(code=3)


@etcd_app.command("start")
def etcd_start() -> None:
    """Start the embedded etcd if it is not running, and print its endpoint."""
    from spotrun import console, etcd_server

    server = etcd_server.ensure_running()
    console.out.print(server.endpoint, markup=False)


@etcd_app.command("status")
def etcd_status(
    json_out: Annotated[bool, typer.Option("--json", help="Print status as JSON on stdout.")] = False,
) -> None:
    """Show whether the embedded etcd runs, where, and its version. Exits 4 when it is down."""
    from spotrun import console, etcd_server

    info = etcd_server.status()
    if json_out:
        console.print_json(info.to_dict() if info else {"running": False})
    elif info:
        console.out.print(f"running  endpoint={info.endpoint} pid={info.pid} version={info.version} data={info.data_dir}", markup=False)
    else:
        console.out.print("stopped")
    if not info:
        raise typer.Exit(code=4)


@etcd_app.command("stop")
def etcd_stop() -> None:
    """Stop the embedded etcd cleanly (its data stays under $SPOTRUN_HOME/etcd)."""
    from spotrun import console, etcd_server

    stopped = etcd_server.stop()
    console.out.print("stopped" if stopped else "not running")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: run the app, turn SpotrunError into one line and its exit code.

    Typer's standalone mode already maps usage errors to exit 2 and `typer.Exit` to its code.
    """
    try:
        app(args=argv, prog_name="spotrun")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except SpotrunError as exc:
        if os.environ.get("SPOTRUN_DEBUG"):
            raise
        lines = exc.problems if isinstance(exc, RecipeError) else [f"spotrun: error: {exc}"]
        sys.stderr.write("".join(line + "\n" for line in lines))
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        return 130
    return 0
