"""Lab 08 end to end through the real CLI on CPU ranks: ring attention (zig-zag) and Ulysses
equal attention on one rank, the zig-zag split evens the causal work where the plain one does
not, bytes and activations per rank follow the predictions, and the Llama trained with its
sequences split (or its experts split) follows its unsharded reference. Bad input is refused
in one line before launch."""

import pytest

from conftest import load_summary
from plscale.predict import context_parallel as predict

SMALL = ["--launcher", "torchrun", "--cpu", "--steps", "3", "--set", "model.preset=tiny", "--set", "model.seq=32",
         "--set", "train.parity_steps=2", "--set", "cp.balance_seq=256", "--set", "cp.comm_seqs=[64,128]",
         "--set", "cp.memory_seqs=[64,128]"]


def run_lab(cli, variant: str, *extra) -> tuple[dict, object]:
    out = cli("lab", "run", variant, *extra)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = sorted(p for p in cli.runs.iterdir() if p.name.endswith(f"cp-ep-{variant}"))[-1]
    return load_summary(run_dir), out


@pytest.mark.e2e
# Every run checks ring attention (both splits) and Ulysses, and measures both; the variant only
# picks the attention the Llama trains with (Ulysses' training: test_context_parallel.py and
# test_cp_deepspeed.py, whose gradients are the dense model's through DeepSpeed)
def test_context_parallel_matches_one_rank(cli):
    variant, ranks = "ring-attention", 2
    s, out = run_lab(cli, variant, "--gpus", str(ranks), *SMALL)
    assert s["passed"], s["checks"]
    assert s["cp"] == ranks  # parallel.cp: world
    names = {c["name"] for c in s["checks"]}
    for check in ("ring attention, zigzag split equals full attention", "zig-zag evens the causal work",
                  "Ulysses (DeepSpeed DistributedAttention) equals full attention",
                  "ring bytes and Ulysses messages as predicted", "activations per rank match the memory model",
                  "the split Llama follows the dense model's loss"):
        assert check in names, names
    plain, zigzag = ([w for w, _ in s["balance"][cut]] for cut in ("plain", "zigzag"))
    assert plain == predict.attention_work(256, ranks, "plain") and len(set(zigzag)) == 1
    assert max(plain) / min(plain) > 2  # the plain split's last rank does most of the work
    for length, one_rank, _, split, _ in s["activations"]:  # cp cuts the activations per rank
        assert split < one_rank / ranks * 1.05, (length, one_rank, split)
    want = "DeepSpeed's comms logger"
    assert want in out.stdout  # on again after the timed steps, for the Ulysses messages
    f = {x["name"]: x for x in s["figures"]}  # the split Llama's training: a sequence counted once, not cp times
    assert 0 < f["MFU"]["value"] < 100 and "GFLOP/s float32 (measured matmul" in f["MFU"]["note"]
    assert f["HFU"]["value"] == f["MFU"]["value"] and "median of 2 timed steps" in f["throughput"]["note"]


@pytest.mark.e2e
@pytest.mark.parametrize("variant", ["moe-by-hand", "moe-deepspeed"])
def test_experts_follow_the_unsharded_reference(cli, variant):
    s, out = run_lab(cli, variant, "--cpu", "--steps", "3", "--set", "model.preset=tiny", "--set", "model.seq=32",
                     "--set", "train.parity_steps=2", "--set", "experts.capacity_sweep=[0.5,2.0]")
    assert s["passed"], s["checks"]
    names = {c["name"] for c in s["checks"]}
    for check in ("top-1 router by hand equals DeepSpeed's gate", "top-2 router by hand equals DeepSpeed's gate",
                  "the expert-parallel model follows the unsharded reference", "all-to-all bytes per step as predicted",
                  "parameters per rank as predicted"):
        assert check in names, names
    assert s["ep"] == 2 and s["impl"] == variant.removeprefix("moe-").replace("by-hand", "hand")
    # 4 all-to-alls of E x C x h per layer: C = ceil(2 x 128 / 4 x 1.25) = 80, h 128, fp32, 2 layers
    assert s["alltoall"] == {"calls": 8, "bytes": 8 * 4 * 80 * 128 * 4}
    (half, _, even_half), (double, measured_double, _) = s["dropped"]
    assert (half, double, measured_double) == (0.5, 2.0, 0.0) and even_half == 50.0  # C = S k / 2E: half the routes
    # MFU counts each token's 2 experts, HFU every one of the E x C = 320 slots of 256 routed tokens: 2.5 a token
    f = {x["name"]: x for x in s["figures"]}
    assert 0 < f["MFU"]["value"] < f["HFU"]["value"] < 100 and "2.5 a token, k = 2" in f["HFU"]["note"]
    assert "median of 1 timed steps" in f["throughput"]["note"]   # 3 steps, less the first and the counted one


@pytest.mark.parametrize("args, message", [
    (["ring-attention", "--set", "model.seq=34"], "model.seq 34 does not cut into 2 x cp = 4 chunks"),
    (["ulysses", "--gpus", "8", "--set", "model.preset=tiny"], "do not split 8 ways; use --gpus 2 or 4"),
    (["ulysses", "--set", "cp.split=zigzag"], "takes the plain split"),
    (["moe", "--set", "experts.count=3"], "experts.count 3 does not split over ep 2 ranks"),
    (["moe", "--set", "experts.capacity_factor=0"], "experts.capacity_factor: capacity factor 0"),
    (["moe", "--set", "experts.top_k=3"], "experts.top_k 3"),
    (["moe", "--gpus", "4", "--set", "parallel.cp=2"], "parallel.cp 2 and parallel.ep 4"),
    (["ring-attention", "--set", "parallel.ep=world"], "one at a time"),
    (["moe", "--set", "parallel.ep=1"], "use parallel.cp=world (ring-attention, ulysses) or parallel.ep=world"),
    (["ring-attention", "--set", "cp.split=foo"], "cp.split 'foo'"),
    (["moe", "--set", "ds.stage=1"], "the MoE layers by hand train at ZeRO 0"),
    (["ring-attention", "--set", "cp.attention=flash"], "cp.attention 'flash'"),
])
def test_bad_input_is_refused_before_launch(quick_cli, args, message):
    cli = quick_cli
    out = cli("lab", "run", *args, "--cpu")
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr + out.stdout, out.stderr + out.stdout
    assert not cli.runs.exists() or not any(cli.runs.iterdir())
