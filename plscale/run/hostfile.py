"""DeepSpeed hostfiles: one line per node, `hostname slots=N` (N ranks on that node).

Read and checked on the host before launching, because DeepSpeed's own parser fails
with a traceback after the run has started. Blank lines and `#` comments are skipped.
"""

import re
from pathlib import Path

from plscale.errors import UserError

LINE = re.compile(r"^(\S+)\s+slots=(\d+)$")


def read_hostfile(path: str) -> dict[str, int]:
    """host -> slots, in file order."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"Hostfile {path} does not exist: write one line per node, 'host slots=N' "
                        f"(see the README, Several nodes).")
    hosts: dict[str, int] = {}
    for number, raw in enumerate(file.read_text(errors="replace").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = LINE.match(line)
        if not match or int(match.group(2)) < 1:
            raise UserError(f"Hostfile {path}, line {number}: {raw.strip()!r} is not 'host slots=N' with N >= 1: "
                            f"write for example 'node0 slots=8'.")
        host = match.group(1)
        if host in hosts:
            raise UserError(f"Hostfile {path}, line {number}: host {host!r} is listed twice: keep one line per node.")
        hosts[host] = int(match.group(2))
    if not hosts:
        raise UserError(f"Hostfile {path} lists no host: write one line per node, 'host slots=N'.")
    return hosts


def render(nodes: int, slots: int) -> str:
    """The hostfile plscale writes for `--node-rank` runs: DeepSpeed's --no_ssh mode still
    wants every node listed; the names only label them."""
    return "".join(f"node{i} slots={slots}\n" for i in range(nodes))
