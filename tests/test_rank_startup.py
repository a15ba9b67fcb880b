"""A rank's start-up around DeepSpeed (plscale/rank/distributed.py): Muon's modules stand in until
something uses Muon, so ZeRO's first step does not compile Muon's kernels, and a Muon optimizer still
builds and is recognised as DeepSpeed's own."""

import sys

import pytest
import torch

from plscale.rank.distributed import MUON, _defer_muon, _Deferred


@pytest.fixture
def muon_unloaded(monkeypatch):
    """sys.modules without Muon's modules, restored afterwards whatever the test loads."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    saved = {name: sys.modules.pop(name) for name in MUON if name in sys.modules}
    yield
    for name in MUON:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


def test_zero_asks_about_muon_without_loading_it_and_muon_still_builds(muon_unloaded):
    import deepspeed.runtime.zero.utils   # noqa: F401  (DeepSpeed itself, before the stand-ins)
    _defer_muon()
    # what ZeRO-1/2 and ZeRO-3 import at their first step, and how they use it
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
    from deepspeed.runtime.zero.muon.original_muon import muon_update  # noqa: F401  (bound, not called)
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4, 4))])
    assert not isinstance(adam, MuonWithAuxAdam)
    assert all(isinstance(sys.modules[name], _Deferred) for name in MUON)    # nothing compiled yet
    # a run that does use Muon: building it loads the real modules, and DeepSpeed's checks then see them
    matrix, vector = torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.zeros(4))
    matrix.use_muon, vector.use_muon = True, False
    muon = MuonWithAuxAdam([{"params": [matrix], "use_muon": True, "lr": 0.02, "weight_decay": 0.0},
                            {"params": [vector], "use_muon": False, "lr": 1e-3, "betas": (0.9, 0.95),
                             "eps": 1e-10, "weight_decay": 0.0}])
    assert not any(isinstance(sys.modules[name], _Deferred) for name in MUON)
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam as real
    from deepspeed.runtime.zero.muon.original_muon import MuonWithAuxAdam as base
    assert isinstance(muon, real) and isinstance(muon, base) and real is not MuonWithAuxAdam
