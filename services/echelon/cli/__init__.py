"""The `echelon` command: one module per command group, all Click (docs/cli.md)."""
