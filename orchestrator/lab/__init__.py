"""The lab: benchmarks (`lab.bench`) and protocol doubles (`lab.doubles`), apart from the daemon.

Nothing the daemon runs imports this package; the CLI loads `orchestrator bench ...` from it lazily.
"""
