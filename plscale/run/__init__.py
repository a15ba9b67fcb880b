"""The host-side flow of a run, in order: the labs registry, settings, the launch plan, the
runner, the run directory, the report. Importing it never imports torch."""
