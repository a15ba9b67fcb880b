"""Adam and AdamW exactly as torch.optim computes them, from the run's DeepSpeed config
(the hyperparameters plscale.rank.optim gives torch), as pure functions of pytrees:

    opt = Adam(ctx.ds_config)
    state = opt.init(params)                           # {"step": 0, "m": zeros, "v": zeros}
    params, state = opt.update(params, grads, state)   # jit-able; shard m, v like params

One step t, for each weight p with gradient g (torch's _single_tensor_adam / adamw):
    Adam:  g = g + wd * p         (L2 decay: part of the gradient, so the moments see it)
    AdamW: p = p * (1 - lr * wd)  (decoupled decay: the moments never see it)
    m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
    p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)    (eps outside the sqrt)
"""

import jax
import jax.numpy as jnp


def state_like(tree, step) -> dict:
    """A pytree shaped like Adam's state: `step` for the step count, `tree` for each moment
    (the layouts shard the moments with the params' shardings)."""
    return {"step": step, "m": tree, "v": tree}


class Adam:
    def __init__(self, ds_config: dict):
        kind = ds_config["optimizer"]["type"]
        p = ds_config["optimizer"]["params"]
        self.decoupled = kind == "AdamW"
        self.lr, self.eps, self.weight_decay = p["lr"], p["eps"], p["weight_decay"]
        self.b1, self.b2 = p["betas"]

    def init(self, params) -> dict:
        # m and v: two trees of zeros, not one tree twice (the step donates both buffers)
        return {"step": jnp.zeros((), jnp.int32), "m": jax.tree.map(jnp.zeros_like, params),
                "v": jax.tree.map(jnp.zeros_like, params)}

    def update(self, params, grads, state):
        t = state["step"] + 1
        tf = t.astype(jnp.float32)
        step_size = self.lr / (1 - self.b1 ** tf)
        bias_correction2_sqrt = jnp.sqrt(1 - self.b2 ** tf)

        def one(p, g, m, v):
            if self.weight_decay and self.decoupled:
                p = p * (1 - self.lr * self.weight_decay)
            elif self.weight_decay:
                g = g + self.weight_decay * p
            m = m + (1 - self.b1) * (g - m)            # torch's lerp
            v = self.b2 * v + (1 - self.b2) * g * g
            p = p - step_size * m / (jnp.sqrt(v) / bias_correction2_sqrt + self.eps)
            return p, m, v

        new = jax.tree.map(one, params, grads, state["m"], state["v"])     # a (p, m, v) per leaf
        params, m, v = (jax.tree.map(lambda _, leaf, i=i: leaf[i], params, new) for i in range(3))
        return params, {"step": t, "m": m, "v": v}
