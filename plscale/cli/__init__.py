from plscale.cli.flag_help import show_flags_bare

show_flags_bare()
