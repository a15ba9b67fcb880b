"""DeepSpeed configs: a typed spec and the JSON it becomes (spec), checks (check, valid), what
each setting does (explain), the standard set (standard). Import the module you need:
`from plscale.dsconfig.spec import DSSpec, build`."""
