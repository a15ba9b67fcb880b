"""Recomputation on plscale's Llama (plscale/strategies/recompute/llama.py) and the allocator's history it is
measured with (plscale/rank/allocations.py): every strategy, DeepSpeed's checkpointing included,
gives no recomputation's loss and gradients exactly, with dropout too; only the recomputed layers
run again in backward, and what they keep is the memory model's. The model's grid of strategies,
cores and precisions is tests/test_recompute_predict.py's; through DeepSpeed's engine on 2 CPU
ranks, tests/test_recompute_lab.py's."""

import socket
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from plscale.errors import UserError
from plscale.predict import activations, memory
from plscale.predict.presets import PRESETS
from plscale.rank import allocations
from plscale.strategies.recompute import llama as recompute
from plscale.rank.models.llama import Llama

SEQ, BATCH = 64, 2
CPU = torch.device("cpu")
ROPE_AND_TARGETS = 2 * SEQ * PRESETS["tiny"].head_dim // 2 * 4 + BATCH * SEQ * 8  # kept, not in the model
DS = {"train_micro_batch_size_per_gpu": BATCH, "activation_checkpointing": {  # as the lab's
    "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False}}


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-rank gloo group in this process, for deepspeed.checkpointing.configure (it asks the rank)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DS_ACCELERATOR", "cpu")
        import deepspeed

        from plscale.rank.distributed import _skip_shm_build

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            _skip_shm_build()
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # wraps the group, sets no env
            yield
        finally:
            dist.destroy_process_group()


def tiny(attention: str = "math"):
    return replace(PRESETS["tiny"], attention=attention)  # 2 layers


def batch(config):
    return torch.randint(0, config.vocab, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))


def step(model, x):
    """One forward and backward, recorded: (loss, gradients, history)."""
    model.zero_grad(set_to_none=True)
    with allocations.record(CPU) as rec:
        with allocations.phase("forward"):
            loss = model(x[:, :-1], x[:, 1:])
        with allocations.phase("backward"):
            loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], rec.history


def loss_and_grads(model, x):
    """One forward and backward, not recorded: (loss, gradients)."""
    loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def built(config, strategy: str, layers: int = 0):
    torch.manual_seed(0)  # the same weights, then the same dropout masks drawn in the forward
    return recompute.apply(Llama(config), strategy, layers, DS if strategy == "deepspeed" else None)


def predicted(config, strategy: str, layers: int = 0) -> float:
    return activations.activation_bytes(memory.Setup(params=1, precision="fp32", model=config, seq=SEQ, micro_batch=BATCH,
                                                recompute=strategy, recompute_layers=layers))


# ---- the allocator's history ----------------------------------------------------------------

def test_history_counts_what_a_phase_allocates_and_keeps():
    with allocations.record(CPU) as rec:
        with allocations.phase("forward"):
            kept = torch.ones(1000)                # 4,000 bytes, still held at the phase's end
            with torch.profiler.record_function("layer 0"):
                gone = torch.ones(500)             # 2,000 bytes, freed inside the phase
                del gone
        with allocations.phase("backward"):
            del kept
    h = rec.history
    assert h.kept() == 4000 and h.kept("backward") == -4000
    assert h.peak() == 6000 and h.live()[1][-1] == 0
    assert h.left_by("layer 0") == 0 and not h.reran("layer 0")
    assert [p.name for p in h.phases] == ["forward", "backward"]


# ---- recomputation changes memory, never the numbers ----------------------------------------

@pytest.mark.parametrize("attention, dropout", [("math", 0.0), ("fused", 0.0), ("math", 0.1)])
def test_every_strategy_gives_the_same_loss_and_gradients(one_rank_group, attention, dropout):
    # With dropout the rerun must draw the forward's masks again: torch's checkpoint restores the
    # RNG state it saved (preserve_rng_state), DeepSpeed's its own copies, or the gradients are
    # those of other masks
    config = replace(tiny(attention), dropout=dropout)
    x = batch(config)
    loss, grads = loss_and_grads(built(config, "none"), x)
    if dropout:
        assert loss != loss_and_grads(built(replace(config, dropout=0.0), "none"), x)[0]  # masks were drawn
    for strategy, layers in (("selective", 0), ("full", 0), ("full", 1), ("deepspeed", 0), ("deepspeed", 1)):
        got_loss, got_grads = loss_and_grads(built(config, strategy, layers), x)
        assert got_loss == loss, (strategy, layers)
        assert all(torch.equal(a, b) for a, b in zip(got_grads, grads)), (strategy, layers)


@pytest.mark.parametrize("strategy, reran", [
    ("none", set()),
    ("selective", {"core 0"}),                  # the first layer's core only
    ("full", {"layer 0", "core 0"}),            # the first layer, its core inside it
])
def test_only_recomputed_layers_run_again_in_backward(strategy, reran):
    config, layers = tiny("math"), 0 if strategy == "none" else 1
    _, _, h = step(built(config, strategy, layers), batch(config))
    labels = {i.name for i in h.labels}
    assert labels == {"layer 0", "layer 1", "core 0", "core 1"}
    assert {name for name in labels if h.reran(name)} == reran
    rows = recompute.measured_layers(h, config.layers)
    assert [r["recomputed"] for r in rows] == [{"none": None, "selective": "core", "full": "layer"}[strategy], None]
    assert rows[1]["rebuilt"] == 0 and (rows[0]["rebuilt"] > 0) == (strategy != "none")
    # one layer of two recomputed keeps what the model says: over it by RoPE's tables and the
    # flattened targets, which it leaves out, and a few scalars
    assert 0 <= h.kept() - predicted(config, strategy, layers) - ROPE_AND_TARGETS <= 64


def test_bad_strategy_or_layers_and_double_application_are_refused():
    config = tiny()
    with pytest.raises(UserError, match="recompute strategy 'partial': use none, selective, full, deepspeed"):
        recompute.apply(Llama(config), "partial")
    with pytest.raises(UserError, match=r"recompute layers 3: the model has 2 layers; use 0 \(every layer\) to 2"):
        recompute.apply(Llama(config), "full", 3)
    with pytest.raises(UserError, match="recompute layers -1"):
        recompute.apply(Llama(config), "full", -1)
    with pytest.raises(UserError, match="recompute layers 1 with recompute strategy none"):
        recompute.apply(Llama(config), "none", 1)
    with pytest.raises(ValueError, match="pass it, apply"):
        recompute.apply(Llama(config), "deepspeed")  # no DeepSpeed config to configure it from
    with pytest.raises(ValueError, match="already applied"):
        recompute.apply(recompute.apply(Llama(config), "full"), "selective")


def test_layer_picture_shows_what_a_recomputed_layer_reads_back_and_reruns(monkeypatch, tmp_path):
    """layers.png's backward: a recomputed layer's bar is what the forward kept, read back, with its
    rerun stacked on it; every value label sits above its bar's stack; one name for the head."""
    from plscale.charts import recompute as recompute_charts

    MiB, drawn = 2**20, {}
    monkeypatch.setattr(recompute_charts, "_save", lambda fig, axes, path, columns: drawn.update(axes=axes))

    class History:  # what layer_picture asks of a history: the bytes kept at the forward's end
        def __init__(self, kept):
            self.kept = lambda: kept

    layers = {"none": [{"layer": 0, "kept": 25 * MiB, "recomputed": None, "rebuilt": 0}],
              "selective": [{"layer": 0, "kept": 21 * MiB, "recomputed": "core", "rebuilt": 6 * MiB}]}
    recompute_charts.layer_picture(tmp_path / "layers.png", {s: History(rows[0]["kept"] + 10 * MiB)
                                                             for s, rows in layers.items()}, layers, "t")
    ax = drawn["axes"][1, 0]
    backward_l0 = [p for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - 4) < 1e-9]  # L0, the last bar
    assert sorted((p.get_y(), p.get_height()) for p in backward_l0) == [(0, 21), (21, 6)]  # read back, then rerun
    notes = {t.get_text(): t.xyann[1] for t in ax.texts}
    assert notes["21.0 read back"] < notes["+6.0 core rerun"] and "4.0 dropped" in notes and "21.0 kept" in notes
    for note in ax.texts:  # anchored at the top of its bar's stack, never under a part of it
        stack = sum(p.get_height() for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - note.xy[0]) < 1e-9)
        assert note.xy[1] == pytest.approx(stack), note.get_text()
    assert [t.get_text() for t in ax.get_xticklabels()].count("emb+head") == 2
    recompute_charts._pyplot().close(ax.figure)
