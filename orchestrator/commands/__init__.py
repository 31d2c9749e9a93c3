"""The CLI's commands, one module per area; `orchestrator.cli` registers them on the `main` group."""
