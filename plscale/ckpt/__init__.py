"""Checkpoints on disk, read and written without torch: manifests, commit, verify, deltas."""

STRATEGIES = {
    "basic": "a full synchronous DeepSpeed checkpoint every `every` steps",
    "incremental": "a full checkpoint every `full_every` steps, XOR-deltas against it in between",
    "async": "a snapshot to node-local memory, written to durable storage in the background",
    "multilevel": "a fast node-local tier every `every` steps, the durable tier every `durable_every`",
}
