"""Exercise fsdp: skeleton.py (the task), solution.py (the reference), checks.py (run by worker.py)."""
