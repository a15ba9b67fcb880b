"""torch.compile against eager: the plain Llama on one process, and lab 04's FSDP2 on 2 ranks.

    python benchmarks/compile_vs_eager.py [--steps 12] [--gpus 2] [--cpu] [--data-dir D] [--set k=v ...]

The plain model: the same weights and batch, `layer.compile()` on every decoder layer (as
torchtitan compiles, one graph a layer), trained side by side with its eager twin: the first
step (compilation included), the median of the rest, and the loss gap. FSDP2: `plscale lab run
fsdp2` with fsdp.compile false and true (each layer compiled, then sharded), eager first, and
the same figures from each run's summary. On CPU inductor writes C++ and builds it with the
machine's compiler (g++ or clang++; CXX), once per layer shape: the first step pays that.
"""

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from plscale.run import flow
from plscale.run.launch import Options


def plain(steps: int, preset_name: str) -> dict:
    """{mode: {first, step, losses}} of the plain model on one process: the first step's seconds,
    the median of the rest, every step's loss."""
    import torch

    from plscale.predict.presets import preset
    from plscale.rank.models.llama import Llama

    torch.manual_seed(0)
    config = preset(preset_name).with_vocab(8192)
    eager = Llama(config)
    compiled = Llama(config)
    compiled.load_state_dict(eager.state_dict())
    for layer in compiled.layers:
        layer.compile()
    batch = torch.randint(0, config.vocab, (4, 65), generator=torch.Generator().manual_seed(1))
    out = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        opt, times, losses = torch.optim.AdamW(model.parameters(), lr=1e-3), [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        out[name] = {"first": times[0], "step": statistics.median(times[1:]), "losses": losses}
    return out


def lab(args, compile_: bool, runs: Path) -> dict:
    opts = Options(gpus=args.gpus, cpu=args.cpu, steps=args.steps, data_dir=args.data_dir,
                   sets=[*args.set, f"fsdp.compile={str(compile_).lower()}"])
    output = io.StringIO()
    try:
        run_dir = flow.run("zero", opts, "fsdp2", Console(file=output, width=160), runs=runs)
    except flow.RunFailed:
        sys.exit(f"fsdp2 (compile {compile_}) failed:\n{output.getvalue()[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = {f["name"]: f["value"] for f in summary["figures"]}
    return {"first": figures["first step"], "step": figures["step time"], "losses": summary["losses"]}


def gap(a: list, b: list) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--preset", default="small", help="the plain model's preset")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    rows = plain(args.steps, args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        fsdp = {mode: lab(args, mode == "compiled", Path(tmp) / "runs") for mode in ("eager", "compiled")}
    print(f"\n{'':26}{'first step s':>14}{'step s':>10}{'compiled/eager':>16}{'loss gap':>11}")
    for what, runs in (("plain Llama, 1 process", rows), (f"FSDP2, {args.gpus} ranks (lab 04)", fsdp)):
        e, c = runs["eager"], runs["compiled"]
        print(f"  {what:24}{e['first']:9.2f} eager{e['step']:10.3f}")
        print(f"  {'':24}{c['first']:9.2f} comp.{c['step']:10.3f}{c['step'] / e['step']:15.2f}x"
              f"{gap(c['losses'], e['losses']):11.1e}")
    print("\nA ratio below 1 pays; the first step is what compiling costs (once: inductor caches its builds in "
          "/tmp/torchinductor_$USER, so a second run compiles in seconds).")


if __name__ == "__main__":
    main()
