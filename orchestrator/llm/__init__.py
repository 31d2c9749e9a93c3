"""Model clients, one bounded gate per backend: the pre-plan pass, the runners and the chat plane share them.

Nothing here imports `chat/`, `plan/` or `runners/`: they build on this package, never the other way.
"""
