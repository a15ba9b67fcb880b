"""What a lab is, how its settings resolve, and the run directory it writes: the code the host
(plscale.run, before launching) and every rank (plscale.rank.runtime, plscale.jaxlab.runtime,
under a plain launcher) share, so both resolve a run the same way.

    labs.py      the registry: labs/NN_slug/lab.yaml, lookup by id, alias, number or variant
    settings.py  defaults, a variant's overrides, --set k=v: nested dicts with dotted keys
    resolve.py   a run resolved once: settings, the lab's checks, the DeepSpeed config
    rundir.py    runs/<time>-<lab>-<variant>/: its name, its inputs, node-local scratch
    entry.py     the lab-agnostic start of an entry script: arguments, inputs, Context
    jaxenv.py    what a JAX lab needs: JAX's floor, the XLA flag for N CPU devices

Imports neither torch nor jax nor plscale.run: the host's CLI starts without them.
"""
