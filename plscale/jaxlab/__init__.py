"""What runs inside a JAX lab's one process (it imports jax; the host never does): the
runtime, the Llama-shaped model, Adam, the four layouts, the pipeline, the collectives
under shard_map, and readers of XLA's compiled HLO and memory."""
