"""The `spotrun` command line: thin commands that parse options and call one core function.

Heavy libraries (torch, libcloud, paramiko, textual, the etcd client) are imported inside the
core functions, never here, so `spotrun --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

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
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More log lines on stderr (-vv for debug).")
    ] = 0,
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
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
    from spotrun.client import console
    from spotrun.recipe.schema import check_files

    checks = check_files(files)
    for check in checks:
        for problem in check.problems:
            console.err.print(problem, markup=False)
    if json_out:
        console.print_json(
            [
                {
                    "file": str(c.path),
                    "valid": c.ok,
                    "name": c.recipe.name if c.recipe else None,
                    "problems": c.problems,
                }
                for c in checks
            ]
        )
    else:
        for check in checks:
            if check.recipe is not None:  # set only when the file is valid
                console.out.print(f"{check.path}: ok (recipe {check.recipe.name})", markup=False)
    if not all(c.ok for c in checks):
        raise typer.Exit(code=3)


@app.command()
def up(
    recipe: Annotated[Path, typer.Argument(help="The recipe file, e.g. recipes/quickstart.yaml.", show_default=False)],
    train: Annotated[bool, typer.Option("--train/--no-train", help="Start the recipe's `run` on the nodes.")] = True,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Stay and stream the cluster's events until the job "
            "finishes (Ctrl-C detaches; the cluster keeps running).",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Launch the recipe's cluster (or reconcile it to its target) and start every node agent.

    Starts the embedded etcd when needed, launches only missing VMs on the cheapest candidate
    with capacity, bootstraps them over SSH with live progress, and returns when every agent
    is alive. Running it again on a running cluster launches nothing. With `control_plane:
    {mode: head}` it starts a head VM holding etcd and the controller, which launches the workers
    while this command prints its events; afterwards nothing of the cluster runs on this machine.
    """
    from spotrun.client import console
    from spotrun.client.up import up as run_up

    result = run_up(recipe, train=train)
    if json_out:
        console.print_json(
            {
                "cluster": result.cluster,
                "launched": result.launched,
                "bootstrapped": result.bootstrapped,
                "nodes": result.nodes,
            }
        )
    else:
        console.out.print(
            f"{result.cluster}: {len(result.nodes)} nodes up "
            f"({len(result.launched)} launched, {len(result.bootstrapped)} bootstrapped); "
            f"see `spotrun status {result.cluster}`",
            markup=False,
        )
    if attach:
        from spotrun.client.connect import connect_cluster
        from spotrun.client.status import follow_events

        with connect_cluster(result.cluster) as store:
            follow_events(
                store, result.cluster, lambda line: console.out.print(line, markup=False), until_finished=True
            )


@app.command()
def status(
    cluster: Annotated[str | None, typer.Argument(help="One cluster; all when omitted.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print status as JSON on stdout.")] = False,
) -> None:
    """Clusters, nodes (provider, zone, type, state, uptime, $/h) and costs. Reads etcd only."""
    from spotrun.client import console
    from spotrun.client.connect import connect_cluster
    from spotrun.client.status import all_statuses, cluster_status, render
    from spotrun.errors import NotFoundError

    if cluster is None:
        statuses = all_statuses()
    else:
        with connect_cluster(cluster) as store:
            if cluster not in store.list_clusters():
                raise NotFoundError(f"no cluster named {cluster!r} in etcd", hint="see `spotrun status`")
            statuses = [cluster_status(store, cluster)]
    if json_out:
        console.print_json(statuses if cluster is None else statuses[0])
    elif statuses:
        render(statuses)
    else:
        console.out.print("no clusters")


@app.command()
def down(
    cluster: Annotated[str, typer.Argument(help="The cluster to stop.", show_default=False)],
    purge: Annotated[bool, typer.Option("--purge", help="Also delete its history, logs and checkpoints.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Terminate every VM of the cluster and stop its agents; stop the embedded etcd when unused.

    Idempotent, and works when etcd or the controller died. Checkpoints and history stay unless --purge.
    """
    from dataclasses import asdict

    from spotrun.client import console
    from spotrun.client.down import down as run_down

    result = run_down(cluster, purge=purge)
    if json_out:
        console.print_json(asdict(result))
        return
    console.out.print(
        f"{cluster}: terminated {len(result.terminated)} VMs"
        + ("; embedded etcd stopped" if result.etcd_stopped else ""),
        markup=False,
    )
    for note in result.notes:
        console.err.print(f"note: {note}", markup=False)


@app.command()
def logs(
    cluster: Annotated[str, typer.Argument(help="The cluster.", show_default=False)],
    node: Annotated[str | None, typer.Argument(help="One node; all when omitted.", show_default=False)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until Ctrl-C.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many past lines to show.")] = 100,
    agent: Annotated[bool, typer.Option("--agent", help="The node agent's log instead of the training log.")] = False,
) -> None:
    """Show the training logs (or the node agents' logs), each line prefixed with its node."""
    from spotrun.client import console
    from spotrun.client.nodes import logs as run_logs

    run_logs(
        cluster, node, follow, lambda vm, text: console.out.print(f"[{vm}] {text}", markup=False), lines, agent=agent
    )


@app.command()
def events(
    cluster: Annotated[str, typer.Argument(help="The cluster.", show_default=False)],
    since: Annotated[int, typer.Option("--since", help="Only events after this sequence number.")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print events as JSON on stdout.")] = False,
) -> None:
    """The cluster's history: launches, joins, notices, leaves, failures, scale, budget and down."""
    from spotrun.client import console
    from spotrun.client.connect import connect_cluster
    from spotrun.client.status import follow_events
    from spotrun.state.records import to_dict

    with connect_cluster(cluster) as store:
        if follow:
            follow_events(store, cluster, lambda line: console.out.print(line, markup=False), since=since)
            return
        history = store.list_events(cluster, since=since)
    if json_out:
        console.print_json([to_dict(e) for e in history])
        return
    for event in history:
        console.out.print(console.format_event(event), markup=False)


@app.command()
def preempt(
    cluster: Annotated[str, typer.Argument(help="The cluster.", show_default=False)],
    node: Annotated[str, typer.Argument(help="The node to preempt (see `spotrun status`).", show_default=False)],
    notice: Annotated[float, typer.Option("--notice", help="Seconds of warning before the VM dies.")] = 30.0,
) -> None:
    """Local provider only: arm a spot preemption notice on a node; the VM dies at the deadline."""
    import time as _time

    from spotrun.client import console
    from spotrun.client.nodes import preempt as run_preempt

    deadline = run_preempt(cluster, node, notice)
    console.out.print(
        f"{node}: preemption notice armed; the VM dies in {max(0.0, deadline - _time.time()):.0f} s", markup=False
    )


@app.command()
def prices(
    provider: Annotated[str | None, typer.Option("--provider", help="Only this provider (local, aws, ...).")] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Only offers whose GPU name contains this, e.g. a100.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print offers as JSON on stdout.")] = False,
) -> None:
    """Candidate offers sorted by $/hour (and $/GPU-hour), spot against on-demand, from every provider.

    Providers without credentials are skipped with a note on stderr; naming one with --provider makes that an error.
    """
    from spotrun.client import console
    from spotrun.client.prices import list_prices, render, to_json

    table = list_prices(provider, gpu)
    if json_out:
        sys.stdout.write(to_json(table) + "\n")
    else:
        render(table, console.out)
    for note in table.notes:
        console.err.print(f"note: {note}", markup=False)


@app.command()
def scale(
    cluster: Annotated[str, typer.Argument(help="The cluster.", show_default=False)],
    nodes: Annotated[
        int, typer.Argument(help="The new target node count (within the recipe's min..max).", show_default=False)
    ],
) -> None:
    """Set the cluster's target size; the controller launches or drains nodes (most expensive first)."""
    from spotrun.client import console
    from spotrun.client.connect import connect_cluster
    from spotrun.controller.scaling import set_target

    with connect_cluster(cluster) as store:
        change = set_target(store, cluster, nodes)
    before = "unset" if change.before is None else change.before
    console.out.print(f"{cluster}: target {before} -> {change.after}", markup=False)


@app.command()
def tui(
    cluster: Annotated[
        str | None, typer.Argument(help="The cluster to watch; a picker when omitted.", show_default=False)
    ] = None,
) -> None:
    """Watch and steer a cluster live: workers, training, costs, checkpoints, events (q quits, ? helps)."""
    from spotrun.tui.app import run

    run(cluster)


@app.command()
def simulate(
    recipe: Annotated[Path, typer.Argument(help="The recipe to plan.", show_default=False)],
    trace: Annotated[
        list[str],
        typer.Option(
            "--trace",
            help="A trace file (spot-traces JSON) or a generator such as "
            "poisson:nodes=4,hours=48,rate=0.2,seed=1; repeat for several zones.",
            show_default=False,
        ),
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", help="spotrun, relaunch-all, checkpoint-restart, on-demand (default: all)."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Steps to train (default: --steps in the recipe's run).")
    ] = None,
    figures: Annotated[
        Path | None, typer.Option("--figures", help="Bench figures JSON (default: $SPOTRUN_HOME/bench-figures.json).")
    ] = None,
    notice_s: Annotated[
        float | None, typer.Option("--notice-s", help="Notice lead time for every provider, seconds.")
    ] = None,
    chart: Annotated[
        Path | None, typer.Option("--chart", help="Also write a chart (.svg) of capacity, world size and progress.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON on stdout.")] = False,
) -> None:
    """Before spending a cent: replay spot traces through the controller's own planner and compare
    spotrun with relaunch-all, checkpoint-restart and on-demand (time, goodput, $, $ per 1000 steps)."""
    from spotrun.client import console
    from spotrun.controller.traces import parse_trace_spec
    from spotrun.simulate.policies import POLICIES, run_simulation
    from spotrun.simulate.report import render_table, terminal_chart, to_json, write_chart

    result = run_simulation(
        recipe,
        [parse_trace_spec(spec) for spec in trace],
        tuple(policy or POLICIES),
        steps=steps,
        figures_file=figures,
        notice_s=notice_s,
    )
    if json_out:
        sys.stdout.write(to_json(result) + "\n")
    else:
        console.out.print(render_table(result), markup=False)
        console.out.print(terminal_chart(result), markup=False)
    if chart is not None:
        console.err.print(f"chart written to {write_chart(result, chart)}", markup=False)


@etcd_app.command("start")
def etcd_start() -> None:
    """Start the embedded etcd if it is not running, and print its endpoint."""
    from spotrun.client import console
    from spotrun.state import etcd_server

    server = etcd_server.ensure_running()
    console.out.print(server.endpoint, markup=False)


@etcd_app.command("status")
def etcd_status(
    json_out: Annotated[bool, typer.Option("--json", help="Print status as JSON on stdout.")] = False,
) -> None:
    """Show whether the embedded etcd runs, where, and its version. Exits 4 when it is down."""
    from spotrun.client import console
    from spotrun.state import etcd_server

    info = etcd_server.status()
    if json_out:
        console.print_json(info.to_dict() if info else {"running": False})
    elif info:
        console.out.print(
            f"running  endpoint={info.endpoint} pid={info.pid} version={info.version} data={info.data_dir}",
            markup=False,
        )
    else:
        console.out.print("stopped")
    if not info:
        raise typer.Exit(code=4)


@etcd_app.command("stop")
def etcd_stop() -> None:
    """Stop the embedded etcd cleanly (its data stays under $SPOTRUN_HOME/etcd)."""
    from spotrun.client import console
    from spotrun.state import etcd_server

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
