"""`plscale runpod`: rent GPUs on RunPod for the labs, use them over SSH, and give them back.

The cost is shown before anything is created; every pod carries RunPod's own terminate
time (--max-hours); `down` checks that RunPod lists none of the pods any more. The API
key is read from RUNPOD_API_KEY or a private file and only ever shown masked.
"""

import os

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.output import Progress, console, make_console
from plscale.errors import UserError
from plscale.runpod import local, provision, remote
from plscale.runpod.api import KeyRefused, RunPodAPI
from plscale.runpod.ssh import user as ssh_user

app = typer.Typer(help="Rent GPUs on RunPod for the labs: cost first, nothing left billing.", no_args_is_help=True)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
NAME_HELP = "Which cluster (the --name given to `up`); needed only when several are up."


def _api() -> RunPodAPI:
    key, source = local.key_and_source()
    return RunPodAPI(key, source=source)


@app.command()
def login() -> None:
    """Store your RunPod API key in a file only you can read (instead of exporting RUNPOD_API_KEY)."""
    key = typer.prompt("RunPod API key (https://www.runpod.io/console/user/settings)", hide_input=True).strip()
    if len(key) < 10 or any(c.isspace() for c in key):
        raise UserError("That does not look like a RunPod API key: copy the whole key from the console's Settings.")
    try:
        RunPodAPI(key).myself()  # refuses a bad key before it is saved
    except KeyRefused:
        raise UserError("RunPod refused the API key you typed: copy it again from https://www.runpod.io/console/user/settings "
                        "(permission All); nothing was saved.") from None
    path = local.save_key(key)
    console.print(f"Saved key {local.mask(key)} to {escape(str(path))} (mode 600).")
    if os.environ.get("RUNPOD_API_KEY"):
        console.print("[yellow]RUNPOD_API_KEY is set in this shell and wins over the file: unset it to use this key.[/]")


@app.command()
def gpus(count: int = typer.Option(1, help="GPUs per pod (stock depends on it)."),
         cloud: str = typer.Option(None, help="Only GPU types offered in this cloud: secure or community.")) -> None:
    """GPU types with memory, price per GPU-hour (secure and community cloud) and stock."""
    cloud = cloud.lower() if cloud else None
    if count < 1:
        raise UserError(f"--count {count}: give the GPUs per pod, 1 or more.")
    if cloud not in (None, "secure", "community"):
        raise UserError(f"--cloud {cloud}: use secure or community.")
    types = [t for t in _api().gpu_types(count) if cloud is None or t.get(f"{cloud}Cloud")]
    table = Table(title=f"RunPod GPU types, {count} per pod", title_justify="left")
    for column in ("id", "name", "GB", "$/h secure", "stock", "$/h community", "stock "):
        table.add_column(column, justify="right" if column.startswith(("GB", "$")) else "left")

    def price(t, which):
        return f"{t[f'{which}Price']:.2f}" if t.get(f"{which}Cloud") and t.get(f"{which}Price") else "-"

    def stock(t, which):
        return ((t.get(which) or {}).get("stockStatus") or "-") if t.get(f"{which}Cloud") else "-"

    for t in sorted(types, key=lambda t: (-(t.get("memoryInGb") or 0), t.get("id") or "")):
        table.add_row(t.get("id") or "?", t.get("displayName") or "?", str(t.get("memoryInGb") or "?"), price(t, "secure"),
                      stock(t, "secure"), price(t, "community"), stock(t, "community"))
    console.print(table)
    console.print("Prices are per GPU-hour; `plscale runpod up --gpus N --gpu-type ID` shows the whole cost first.")


@app.command()
def up(gpus: int = typer.Option(..., help="GPUs per pod."),
       gpu_type: str = typer.Option(..., help="A GPU type id or name from `plscale runpod gpus`."),
       nodes: int = typer.Option(1, help="Pods (nodes); several form one multi-node cluster."),
       cloud: str = typer.Option("secure", help="secure (RunPod's data centres) or community (cheaper)."),
       volume: int = typer.Option(20, help="Pod volume in GB, mounted at /workspace (bills while the pod exists)."),
       disk: int = typer.Option(40, help="Container disk in GB."),
       image: str = typer.Option(provision.Request.image, help="Container image (RunPod's PyTorch image by default)."),
       max_hours: float = typer.Option(2.0, help="RunPod terminates the pods after this many hours, whatever happens here."),
       name: str = typer.Option("plscale", help="Cluster name (pods are called plscale-NAME-NODE)."),
       ssh_key: str = typer.Option(None, help="Private SSH key (its .pub goes to the pods); default ~/.ssh/id_ed25519."),
       remote_dir: str = typer.Option("/workspace/plscale", help="Where `sync` puts the project on the pods."),
       timeout: float = typer.Option(900, help="Seconds to wait for the pods to answer over SSH."),
       yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before creating (the cost is still shown).")) -> None:
    """Create pods for the labs: shows the cost, asks, creates, waits until SSH answers."""
    req = provision.Request(gpus, gpu_type, nodes, cloud, volume, disk, image, max_hours, name, ssh_key,
                            remote_dir, timeout)
    state = local.load_state()
    api = _api()
    if name in state["clusters"] and not provision.still_listed(api, [p["id"] for p in state["clusters"][name]["pods"]]):
        local.drop_cluster(name)  # its pods are gone (their --max-hours passed, or the console): forget it
        console.print(f"RunPod no longer lists the pods of the earlier cluster {escape(name)!r}: cleared its record.")
        state = local.load_state()
    key = provision.check(req, state)
    q = provision.quote(api, req)
    _show_quote(req, q)
    provision.check_balance(q)
    if not yes and not typer.confirm(f"Create {nodes} pod(s) at ${q.per_hour:.2f}/h?", default=False):
        console.print("Nothing created.")
        raise typer.Exit(1)
    with Progress() as progress:
        cluster = provision.create(api, req, q, key, progress)
    console.print(f"[green]Up:[/] {nodes} pod(s), {escape(q.gpu['id'])}, ${q.per_hour:.2f}/h; RunPod terminates "
                  f"them at {cluster['terminate_after']} at the latest.")
    _show_pods(cluster)
    console.print("Next: `plscale runpod run zero2` (copies the project, installs it on first use, runs the lab), "
                  "`plscale runpod down` when done.")


def _reachable(name: str | None) -> dict:
    """The cluster, once every pod of it has an SSH address (an `up` killed half-way leaves some without)."""
    cluster = local.cluster_of(local.load_state(), name)
    waiting = [p["id"] for p in cluster["pods"] if not p.get("host")]
    if waiting:
        raise UserError(f"Pod(s) {', '.join(waiting)} of cluster {cluster['name']!r} have no SSH address (their `up` "
                        f"did not finish): `plscale runpod down --name {cluster['name']}`, then `up` again.")
    return cluster


def _show_quote(req: provision.Request, q: provision.Quote) -> None:
    table = Table(title="Cost of this request (RunPod's prices now)", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("GPUs", f"{req.nodes} pod(s) x {req.gpus} x {q.gpu['id']} ({q.gpu.get('memoryInGb', '?')} GB), "
                          f"{req.cloud} cloud")
    table.add_row("per GPU-hour", f"${q.per_gpu_hour:.2f}")
    table.add_row("per hour, all pods", f"${q.per_hour:.2f}")
    table.add_row(f"for --max-hours {req.max_hours:g}", f"${q.for_max_hours:.2f} at most (then RunPod terminates them)")
    table.add_row("your balance", f"${q.balance:.2f}  (API key {local.mask(local.api_key())})")
    console.print(table)


def _show_pods(cluster: dict, live: dict | None = None) -> None:
    table = Table(title=f"cluster {escape(cluster['name'])}", title_justify="left")
    for column in ("node", "pod", "state", "$/h", "ssh (plscale runpod ssh --node N)"):
        table.add_column(column)
    for pod in cluster["pods"]:
        found = (live or {}).get(pod["id"], pod)
        state = "gone" if found is None else (found.get("desiredStatus") or "RUNNING")
        cost = (found or {}).get("costPerHr", pod.get("cost_per_hr"))
        where = f"{ssh_user()}@{pod['host']}:{pod['port']}" if pod.get("host") else "-"
        table.add_row(str(pod["node"]), pod["id"], state, f"{cost:.2f}" if cost else "-", where)
    console.print(table)


@app.command()
def status(name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """The pods this tool created: state, cost per hour, SSH address, and when RunPod terminates them."""
    state = local.load_state()
    api = _api()
    clusters = [local.cluster_of(state, name)] if name else list(state["clusters"].values())
    if not clusters:
        console.print("No pods recorded here.")
    for cluster in clusters:
        live = {p["id"]: api.pod(p["id"]) for p in cluster["pods"]}
        _show_pods(cluster, live)
        per_hour = sum((p or {}).get("costPerHr") or 0 for p in live.values())
        if all(p is None for p in live.values()):
            console.print("RunPod no longer lists these pods (their --max-hours passed, or they were terminated in "
                          "the console): `plscale runpod down` clears the record.")
            continue
        console.print(f"${per_hour:.2f}/h now; RunPod terminates them at {cluster['terminate_after']}, "
                      f"{_time_left(cluster['terminate_after'])} (--max-hours {cluster['max_hours']:g}).")
    _warn_strays(api, state)


def _time_left(when: str) -> str:
    from datetime import datetime, timezone

    minutes = int((datetime.fromisoformat(when) - datetime.now(timezone.utc)).total_seconds() // 60)
    return f"in {minutes // 60} h {minutes % 60:02d} min" if minutes > 0 else "now"


def _warn_strays(api: RunPodAPI, state: dict) -> bool:
    found = provision.strays(api, state)
    for pod in found:
        console.print(f"[yellow]Pod {pod['id']} ({escape(pod['name'])}) was made by plscale but is not in "
                      f"{escape(str(local.state_file()))}, and may be billing: `plscale runpod down --all` "
                      f"terminates it.[/]")
    return bool(found)


@app.command(context_settings=PASS_THROUGH)
def ssh(ctx: typer.Context, node: int = typer.Option(0, help="Which node."),
        name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """Open a shell on a pod, or run a command there: `plscale runpod ssh -- nvidia-smi`."""
    raise typer.Exit(remote.shell(_reachable(name), node, list(ctx.args)))


@app.command()
def sync(name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """Copy this project to every pod (rsync over SSH; runs/, .venv and caches stay behind) and install it."""
    cluster = _reachable(name)
    with Progress() as progress:
        remote.sync(cluster, progress)
    console.print(f"Synced to {len(cluster['pods'])} pod(s) at {escape(cluster['remote_dir'])}.")


@app.command(context_settings=PASS_THROUGH)
def run(ctx: typer.Context, lab: str = typer.Argument(..., help="A lab, as for `plscale lab run`."),
        name: str = typer.Option(None, help=NAME_HELP),
        no_sync: bool = typer.Option(False, "--no-sync", help="Do not copy the project first."),
        detach: bool = typer.Option(False, "--detach", help="Start the run and return (`logs -f` follows it)."),
        env: list[str] = typer.Option(None, "--env", help="K=V set on every pod for the run, e.g. "
                                                         "NCCL_SOCKET_IFNAME=eth1 (repeat for more)."),
        master_port: int = typer.Option(29500, help="Node 0's port for a multi-node run.")) -> None:
    """Run a lab on the pods: `plscale runpod run zero2 --steps 50` (lab options pass through).

    On several pods every node starts the deepspeed launcher (--no_ssh) with its rank and node 0's
    address. The run goes on if the connection drops; Ctrl-C stops it on every pod."""
    from plscale.lab.labs import find

    find(lab)  # an unknown lab fails here, in one line, before minutes of syncing
    variables = dict(_pair(item) for item in env or [])
    cluster = _reachable(name)
    if not no_sync:
        sync(name=name)
    code = remote.run(cluster, lab, list(ctx.args), variables, detach, master_port, make_console(stderr=True).print)
    raise typer.Exit(code)


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.replace("_", "").isalnum() or key[0].isdigit():
        raise UserError(f"--env {item!r}: write NAME=VALUE, e.g. --env NCCL_DEBUG=INFO.")
    return key, value


@app.command()
def logs(follow: bool = typer.Option(False, "--follow", "-f", help="Keep following until the run ends."),
         lines: int = typer.Option(50, "--lines", "-n", min=1, help="How many of the last lines."),
         node: int = typer.Option(0, help="Which node."), name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """The output of the latest run on a pod."""
    raise typer.Exit(remote.logs(_reachable(name), node, follow, lines))


@app.command()
def fetch(runs: list[str] = typer.Argument(None, help="Run directory names (default: every run on the pods)."),
          node: int = typer.Option(0, help="Which node (another node's runs go to runs/node-K/)."),
          name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """Copy run directories back from a pod into runs/, so `plscale report` works here."""
    from plscale.lab.rundir import runs_root

    cluster = _reachable(name)
    with Progress() as progress:
        new = remote.fetch(cluster, runs or [], node, runs_root(), progress)
    for run_dir in new:
        console.print(f"fetched {escape(str(run_dir))}")
    where = runs_root() if node == 0 else runs_root() / f"node-{node}"
    console.print(f"{len(new)} new run director{'y' if len(new) == 1 else 'ies'} in {escape(str(where))}"
                  + (f": `plscale report {escape(str(new[-1]))}`" if new else " (the others were here already)."))


@app.command()
def down(name: str = typer.Option(None, help=NAME_HELP),
         all_: bool = typer.Option(False, "--all", help="Every pod this tool created: every cluster, and pods named "
                                                        "plscale-* in the account that the state file lost."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask first.")) -> None:
    """Terminate the pods (their disks and volumes go too: `fetch` first) and check nothing is left billing."""
    state = local.load_state()
    api = _api()
    if all_:
        clusters, ids = list(state["clusters"].values()), provision.ours(api, state)
    elif name is None and not state["clusters"]:
        clusters, ids = [], []
    else:
        clusters = [local.cluster_of(state, name)]
        ids = [p["id"] for p in clusters[0]["pods"]]
    live = provision.still_listed(api, ids)
    gone = [i for i in ids if i not in live]
    if live and not yes and not typer.confirm(
            f"Terminate {len(live)} pod(s) ({', '.join(live)})? Their files go with them.", default=False):
        console.print("Nothing terminated.")
        raise typer.Exit(1)
    left = []
    if live:
        with Progress() as progress:
            progress(f"terminating {len(live)} pod(s)")
            left = provision.terminate_all(api, live)
    for cluster in clusters:
        local.keep_pods(cluster, left)
    if left:
        again = " --all" if all_ else f" --name {clusters[0]['name']}"
        raise UserError(f"RunPod still lists {', '.join(left)} after terminating: run `plscale runpod down{again}` "
                        f"again, or terminate it at https://www.runpod.io/console/pods.")
    if live:
        console.print(f"[green]Terminated {len(live)} pod(s)[/] ({', '.join(live)}); RunPod lists none of them now.")
    if gone:
        console.print(f"Already gone (terminated at their --max-hours, or in the console): {', '.join(gone)}.")
    if not ids:
        console.print("No pods recorded here.")
    if not _warn_strays(api, state):
        console.print("From plscale: nothing left billing.")
