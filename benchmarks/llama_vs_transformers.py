"""plscale's Llama against transformers' LlamaForCausalLM of the same shape, in one process.

    python benchmarks/llama_vs_transformers.py                     # preset small, batch 4 x 128, 1 thread
    python benchmarks/llama_vs_transformers.py --rounds 5 --iters 20 --threads 1
    python benchmarks/llama_vs_transformers.py --profile           # + torch.profiler's top ops of each

Times forward, backward and an Adam step of each model (no DeepSpeed, no ranks) on the
same random tokens with the same thread count; the two alternate `--rounds` times so both
see the same machine. Prints the median ms of each phase per side and the ratio
plscale / transformers. The transformers model is built offline from a LlamaConfig
(`bare_models.transformers_llama`): no weights are downloaded.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bare_models import build, loss_of  # noqa: E402
from plscale.predict.presets import preset  # noqa: E402


def time_phases(model, opt, kind, x, y, iters: int) -> dict:
    """Median seconds of forward, backward and step over `iters` iterations."""
    phases = {"forward": [], "backward": [], "step": []}
    for _ in range(iters):
        t0 = time.perf_counter()
        loss = loss_of(model, kind, x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for name, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
            phases[name].append(dt)
    return {k: statistics.median(v) for k, v in phases.items()}


def profile(model, opt, kind, x, y, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(2):
        loss_of(model, kind, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            loss_of(model, kind, x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    print(f"\n--- {kind}: top ops by self CPU time, 5 iterations ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = preset(args.preset)
    torch.manual_seed(0)
    block = torch.randint(0, config.vocab, (args.batch, args.seq + 1))
    x, y = block[:, :-1], block[:, 1:]
    sides = {}
    for kind in ("plscale", "transformers"):
        torch.manual_seed(0)
        model = build(kind, config)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        time_phases(model, opt, kind, x, y, 3)  # warm up
        sides[kind] = (model, opt)
    print(f"'{args.preset}' ({sum(p.numel() for p in sides['plscale'][0].parameters()):,} parameters), "
          f"batch {args.batch} x {args.seq}, {torch.get_num_threads()} thread(s); median ms per iteration")
    results = {kind: [] for kind in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for kind in order:
            results[kind].append(time_phases(*sides[kind], kind, x, y, args.iters))
        line = "  ".join(f"{kind} " + " ".join(f"{k[0]}{v * 1e3:6.1f}" for k, v in results[kind][-1].items())
                         + f" = {sum(results[kind][-1].values()) * 1e3:6.1f}" for kind in sides)
        print(f"round {r + 1}: {line}")
    # ratio of medians, and the median of the per-round ratios (each round's pair saw the same machine)
    print(f"{'phase':10}{'plscale':>10}{'transformers':>14}{'ratio':>8}{'paired':>8}   (ms; ratio = plscale / transformers)")
    for phase in ("forward", "backward", "step", "total"):
        pick = (lambda d: sum(d.values())) if phase == "total" else (lambda d: d[phase])
        med = {k: statistics.median(pick(d) for d in v) for k, v in results.items()}
        paired = statistics.median(pick(a) / pick(b) for a, b in zip(results["plscale"], results["transformers"]))
        print(f"{phase:10}{med['plscale'] * 1e3:10.2f}{med['transformers'] * 1e3:14.2f}"
              f"{med['plscale'] / med['transformers']:8.3f}{paired:8.3f}")
    if args.profile:
        for kind in sides:
            profile(*sides[kind], kind, x, y, args.rows)


if __name__ == "__main__":
    main()
