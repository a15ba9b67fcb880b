"""`plscale runpod`: rent GPUs on RunPod for the labs, use them over SSH, and give them back.

On RunPod's REST API v2. The cost is shown before anything is created; a watchdog on
every pod ends it at --max-hours with the pod's own key; `down` checks that RunPod lists
none of it any more. The API key is read from RUNPOD_API_KEY or a private file and only
ever shown masked.
"""

import os

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.output import Progress, console, make_console
from plscale.errors import UserError
from plscale.runpod import local, provision, remote
from plscale.runpod.api import Forbidden, KeyRefused, RunPodAPI
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
        RunPodAPI(key).pods()  # refuses a bad key before it is saved
    except KeyRefused:
        raise UserError("RunPod refused the API key you typed: copy it again from https://www.runpod.io/console/user/settings "
                        "(permission All); nothing was saved.") from None
    except Forbidden:
        raise UserError("RunPod knows the key you typed but it may not manage pods: give it the permission All at "
                        "https://www.runpod.io/console/user/settings; nothing was saved.") from None
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
    api = _api()
    by_cloud = {c: {t["id"]: t for t in api.gpus(count, "POD", c.upper())} for c in ("secure", "community")}
    types = [t for t in by_cloud["secure"].values() if cloud is None or t.get(cloud)]
    table = Table(title=f"RunPod GPU types, {count} per pod", title_justify="left")
    for column in ("id", "name", "GB", "$/h secure", "stock", "$/h community", "stock ", "most per pod"):
        table.add_column(column, justify="right" if column.startswith(("GB", "$", "most")) else "left")

    def price(t, which):
        return f"{t['price'][which]:.2f}" if t.get(which) and t["price"].get(which) else "-"

    def stock(t, which):
        found = by_cloud[which].get(t["id"]) or {}
        return found.get("availability", "-") if t.get(which) else "-"

    def most(t):
        return "/".join(str(t["maxCount"].get(c) or "-") for c in ("secure", "community"))

    for t in sorted(types, key=lambda t: (-(t.get("memory") or 0), t.get("id") or "")):
        table.add_row(t["id"], t.get("name") or "?", str(t.get("memory") or "?"), price(t, "secure"),
                      stock(t, "secure"), price(t, "community"), stock(t, "community"), most(t))
    console.print(table)
    console.print("Prices are per GPU-hour; stock is NONE, LOW, MEDIUM or HIGH for this many GPUs a pod; "
                  "`plscale runpod up --gpus N --gpu-type ID` shows the whole cost first.")


@app.command()
def up(gpus: int = typer.Option(..., help="GPUs per pod."),
       gpu_type: str = typer.Option(..., help="A GPU type id or name from `plscale runpod gpus`."),
       nodes: int = typer.Option(1, help="Nodes; several are one RunPod Instant Cluster on a private network."),
       cloud: str = typer.Option("secure", help="secure (RunPod's data centres) or community (cheaper, one node)."),
       volume: int = typer.Option(20, help="Volume in GB at /workspace, 0 for none (bills while the pod exists)."),
       disk: int = typer.Option(40, help="Container disk in GB."),
       image: str = typer.Option(provision.Request.image, help="Container image (RunPod's PyTorch image by default)."),
       max_hours: float = typer.Option(2.0, help="Each pod's watchdog ends it after this many hours, whatever "
                                                 "happens here."),
       name: str = typer.Option("plscale", help="Name: the pod is plscale-NAME-0, a cluster plscale-NAME."),
       ssh_key: str = typer.Option(None, help="Private SSH key (its .pub goes to your RunPod account's SSH keys); "
                                              "default ~/.ssh/id_ed25519."),
       remote_dir: str = typer.Option("/workspace/plscale", help="Where `sync` puts the project on the pods."),
       timeout: float = typer.Option(900, help="Seconds to wait for the pods to answer over SSH."),
       yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask (the cost is still shown, and a key added to "
                                                           "the account is said).")) -> None:
    """Create a pod, or a cluster of --nodes: shows the cost, asks, creates, waits until SSH answers on each."""
    req = provision.Request(gpus, gpu_type, nodes, cloud, volume, disk, image, max_hours, name, ssh_key,
                            remote_dir, timeout)
    state = local.load_state()
    api = _api()
    if name in state["clusters"] and not provision.still_listed(api, provision.record_items(state["clusters"][name])):
        local.drop_cluster(name)  # its pods are gone (their --max-hours passed, or the console): forget it
        console.print(f"RunPod no longer lists the earlier {escape(name)!r}: cleared its record.")
        state = local.load_state()
    _warn_overdue(state)
    key = provision.check(req, state)
    q = provision.quote(api, req)
    _show_quote(req, q)
    what = f"a {nodes}-node Instant Cluster" if nodes > 1 else "1 pod"
    if not yes and not typer.confirm(f"Create {what} at ${q.per_hour:.2f}/h?", default=False):
        console.print("Nothing created.")
        raise typer.Exit(1)
    registered, keys = provision.key_registered(api, key)
    if not registered:
        console.print(f"Your public key {escape(str(key))}.pub is not among your RunPod account's SSH keys "
                      f"({len(keys)} registered); RunPod puts only those on the pods.")
        if not yes and not typer.confirm("Add it to your account's SSH keys (the others stay)?", default=False):
            console.print("Nothing created: add the key at https://www.runpod.io/console/user/settings "
                          "(SSH Public Keys), or answer yes.")
            raise typer.Exit(1)
        provision.register_key(api, key, keys)
        console.print(f"Added {escape(str(key))}.pub to your RunPod account's SSH keys.")
    with Progress() as progress:
        record = provision.create(api, req, q, key, progress)
    console.print(f"[green]Up:[/] {what}, {nodes * gpus} x {escape(q.gpu['id'])}, ${q.per_hour:.2f}/h; each pod's "
                  f"watchdog ends it at {record['terminate_after']} at the latest.")
    _show_pods(record)
    console.print("Next: `plscale runpod run zero2` (copies the project, installs it on first use, runs the lab), "
                  "`plscale runpod down` when done.")


def _reachable(name: str | None) -> dict:
    """The cluster, once every pod of it has an SSH address (an `up` killed half-way leaves some without)."""
    state = local.load_state()
    _warn_overdue(state)
    cluster = local.cluster_of(state, name)
    waiting = [p["id"] for p in cluster["pods"] if not p.get("host")]
    if waiting or not cluster["pods"]:
        raise UserError(f"{', '.join(waiting) or 'Its nodes'} of {cluster['name']!r} have no SSH address (their `up` "
                        f"did not finish): `plscale runpod down --name {cluster['name']}`, then `up` again.")
    return cluster


def _warn_overdue(state: dict) -> None:
    for line in provision.overdue(state):
        console.print(f"[yellow]{escape(line)}[/]")


def _show_quote(req: provision.Request, q: provision.Quote) -> None:
    table = Table(title="Cost of this request (RunPod's prices now)", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    shape = f"{req.nodes} nodes (one Instant Cluster)" if req.nodes > 1 else "1 pod"
    table.add_row("GPUs", f"{shape} x {req.gpus} x {q.gpu['id']} ({q.gpu.get('memory', '?')} GB), {req.cloud} cloud")
    table.add_row("stock", q.availability)
    table.add_row("per GPU-hour", f"${q.per_gpu_hour:.2f}")
    table.add_row("per hour, all nodes", f"${q.per_hour:.2f}")
    table.add_row(f"for --max-hours {req.max_hours:g}", f"${q.for_max_hours:.2f} at most (then the pods end themselves)")
    table.add_row("API key", local.mask(local.api_key()))
    console.print(table)
    console.print("RunPod's API does not report the account's balance: RunPod refuses the create if it is too low "
                  "(https://www.runpod.io/console/user/billing).")


def _show_pods(cluster: dict, live: dict | None = None, watch: dict | None = None) -> None:
    kind = f"Instant Cluster {cluster['cluster_id']}" if cluster.get("cluster_id") else "pod"
    table = Table(title=f"{escape(cluster['name'])} ({kind})", title_justify="left")
    for column in ("node", "pod", "state", "$/h", "ssh (plscale runpod ssh --node N)", *(["watchdog"] if watch else [])):
        table.add_column(column)
    for pod in cluster["pods"]:
        found = (live or {}).get(pod["id"], pod)
        state = "gone" if found is None else (found.get("status") or "RUNNING")
        cost = (found or {}).get("cost", pod.get("cost_per_hr"))
        where = f"{ssh_user()}@{pod['host']}:{pod['port']}" if pod.get("host") else "-"
        table.add_row(str(pod["node"]), pod["id"], state, f"{cost:.2f}" if cost else "-", where,
                      *([escape(watch.get(pod["id"], "-"))] if watch else []))
    console.print(table)


@app.command()
def status(name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """What this tool created: state, cost per hour, SSH address, each pod's watchdog, and when they end."""
    state = local.load_state()
    api = _api()
    _warn_overdue(state)
    records = [local.cluster_of(state, name)] if name else list(state["clusters"].values())
    if not records:
        console.print("No pods recorded here.")
    for record in records:
        if record.get("cluster_id") and api.cluster(record["cluster_id"]) is None:
            live = {p["id"]: None for p in record["pods"]}
        elif record.get("cluster_id"):
            members = {p["id"]: p for p in api.cluster_pods(record["cluster_id"])}
            live = {p["id"]: members.get(p["id"]) for p in record["pods"]}
        else:
            live = {p["id"]: api.pod(p["id"]) for p in record["pods"]}
        if all(p is None for p in live.values()):
            _show_pods(record, live)
            console.print("RunPod no longer lists these (their --max-hours passed, or they were deleted in the "
                          "console): `plscale runpod down` clears the record.")
            continue
        watch = {p["id"]: provision.watchdog_status(record, p) or "not started" for p in record["pods"]
                 if p.get("host") and live.get(p["id"])}
        _show_pods(record, live, watch)
        per_hour = sum((p or {}).get("cost") or 0 for p in live.values())
        console.print(f"${per_hour:.2f}/h now; the watchdogs end them at {record['terminate_after']}, "
                      f"{_time_left(record['terminate_after'])} (--max-hours {record['max_hours']:g}).")
    _warn_strays(api, state)


def _time_left(when: str) -> str:
    from datetime import datetime, timezone

    minutes = int((datetime.fromisoformat(when) - datetime.now(timezone.utc)).total_seconds() // 60)
    return f"in {minutes // 60} h {minutes % 60:02d} min" if minutes > 0 else "now"


def _warn_strays(api: RunPodAPI, state: dict) -> bool:
    found = provision.strays(api, state)
    for kind, i, label in found:
        console.print(f"[yellow]{kind.capitalize()} {i} ({escape(label)}) was made by plscale but is not in "
                      f"{escape(str(local.state_file()))}, and may be billing: `plscale runpod down --all` "
                      f"ends it.[/]")
    return bool(found)


@app.command(context_settings=PASS_THROUGH)
def ssh(ctx: typer.Context, node: int = typer.Option(0, help="Which node."),
        name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """Open a shell on a pod, or run a command there: `plscale runpod ssh -- nvidia-smi`."""
    raise typer.Exit(remote.shell(_reachable(name), node, list(ctx.args)))


@app.command()
def sync(name: str = typer.Option(None, help=NAME_HELP)) -> None:
    """Copy this project to every pod (rsync over SSH; runs/, .venv, .env, keys and caches stay behind) and install it."""
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

    On several nodes every node starts the deepspeed launcher (--no_ssh) with its rank and node 0's
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
         all_: bool = typer.Option(False, "--all", help="Everything this tool created: every record, and pods and "
                                                        "clusters named plscale-* in the account that the state file lost."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask first.")) -> None:
    """Delete the pod or cluster (disks and volumes go too: `fetch` first) and check nothing is left billing."""
    state = local.load_state()
    api = _api()
    if all_:
        records, items = list(state["clusters"].values()), provision.ours(api, state)
    elif name is None and not state["clusters"]:
        records, items = [], []
    else:
        records = [local.cluster_of(state, name)]
        items = provision.record_items(records[0])  # and what a create whose answer was lost made under its name:
        items += [r for r in provision.named(api, records[0]["name"]) if r not in items]
    live = provision.still_listed(api, items)
    gone = [i for kind, i in items if (kind, i) not in live]
    said = ", ".join(f"{kind} {i}" for kind, i in live)
    if live and not yes and not typer.confirm(f"Delete {said}? Their files go with them.", default=False):
        console.print("Nothing deleted.")
        raise typer.Exit(1)
    left, reasons = [], {}
    if live:
        with Progress() as progress:
            progress(f"deleting {said}")
            left, reasons = provision.terminate_all(api, live)
    for record in records:
        provision.keep(record, left)
    if left:
        again = " --all" if all_ else f" --name {records[0]['name']}"
        why = "; ".join(f"{i}: {reasons[i]}" for _, i in left if i in reasons)
        raise UserError(f"RunPod still lists {', '.join(i for _, i in left)} after deleting"
                        f"{' (RunPod said ' + why + ')' if why else ''}: run `plscale runpod down{again}` again, or "
                        f"delete it at https://www.runpod.io/console/pods.")
    if live:
        console.print(f"[green]Deleted[/] {said}; RunPod lists none of it now.")
    if gone:
        console.print(f"Already gone (ended at their --max-hours, or in the console): {', '.join(gone)}.")
    if not items:
        console.print("No pods recorded here.")
    if not _warn_strays(api, state):
        console.print("From plscale: nothing left billing.")
