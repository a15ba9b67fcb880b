"""The JAX lab's model and optimizer equal the PyTorch ones: same loss and gradients on the
same weights and batch, same Adam/AdamW steps."""

from dataclasses import replace

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")
torch = pytest.importorskip("torch")

import jax.numpy as jnp

from plscale.jaxlab import model, weights
from plscale.jaxlab.adam import Adam
from plscale.predict.presets import preset
from plscale.rank.models.llama import Llama
from plscale.rank.optim import optimizer

FAST_COMPILE = {"xla_backend_optimization_level": 0}   # half XLA's CPU compile time, same numbers
CONFIGS = {   # each compiles once
    "small": (preset("small"), 32),
    # tiny with grouped-query attention (k/v heads repeated) and an untied output head
    "tiny-gqa-untied": (replace(preset("tiny"), kv_heads=2, tie_embeddings=False), 64),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_loss_and_gradients_equal_torch(name):
    config, seq = CONFIGS[name]
    torch.manual_seed(0)
    torch_model = Llama(config)
    tokens, targets = torch.randint(0, config.vocab, (2, 2, seq), generator=torch.Generator().manual_seed(1))
    torch_loss = torch_model(tokens, targets)
    torch_loss.backward()

    params = weights.from_torch(torch_model)
    loss, grads = jax.jit(jax.value_and_grad(model.loss), static_argnums=3, compiler_options=FAST_COMPILE)(
        params, jnp.asarray(tokens.numpy()), jnp.asarray(targets.numpy()), config)

    assert float(loss) == pytest.approx(torch_loss.item(), abs=1e-5)
    jax_grads = weights.to_state_dict(grads, config)
    for weight, p in torch_model.named_parameters():   # every weight, lm_head too when untied
        np.testing.assert_allclose(jax_grads[weight], p.grad.numpy(), atol=1e-6, err_msg=weight)


def test_weights_round_trip_into_torch():
    config = replace(preset("tiny"), tie_embeddings=False)
    source, target = Llama(config), Llama(config)
    state = weights.to_state_dict(weights.from_torch(source), config)
    target.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_adam_steps_as_torch(kind):
    """5 steps with weight decay: Adam's L2 term in the gradient, AdamW's decoupled decay."""
    ds_config = {"optimizer": {"type": kind, "params": {"lr": 1e-2, "weight_decay": 0.1, "betas": [0.9, 0.95],
                                                        "eps": 1e-8}}}
    rng = np.random.default_rng(0)
    start = {"w": rng.standard_normal((7, 5)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    torch_params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in start.items()}
    torch_opt = optimizer(list(torch_params.values()), ds_config)
    opt = Adam(ds_config)
    params = jax.tree.map(jnp.asarray, start)
    state = opt.init(params)
    update = jax.jit(opt.update)
    for _ in range(5):
        grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in start.items()}
        for k, p in torch_params.items():
            p.grad = torch.from_numpy(grads[k])
        torch_opt.step()
        params, state = update(params, jax.tree.map(jnp.asarray, grads), state)
    assert int(state["step"]) == 5
    for k, p in torch_params.items():
        np.testing.assert_allclose(params[k], p.detach().numpy(), atol=1e-6)
        np.testing.assert_allclose(state["m"][k], torch_opt.state[p]["exp_avg"].numpy(), atol=1e-6)
        np.testing.assert_allclose(state["v"][k], torch_opt.state[p]["exp_avg_sq"].numpy(), atol=1e-6)
