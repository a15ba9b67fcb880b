"""Exercise tp_column: skeleton.py (the task), solution.py (the reference), checks.py (run by worker.py)."""
