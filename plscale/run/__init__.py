"""The host side of a run, in order: the launch plan (launch, launchers, hostfile), the runner,
flow (a run or a sweep from start to report, callable in-process: the CLI, the slides' refresh
and the benchmarks call it), the report, the comparison of runs and the labs' references.
What a lab is, its settings and the run directory are plscale.lab, which the ranks share.
Importing it never imports torch; nothing under rank/, strategies/, dsconfig/ or jaxlab/
imports it (tests/test_imports.py)."""
