"""The command line: `writ` and its subcommands."""
