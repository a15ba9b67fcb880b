"""Checkpoint strategies inside the ranks: basic, incremental, asynchronous, multi-level."""
