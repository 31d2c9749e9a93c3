"""The daemon's one Claude client, made on first use: importing the SDK costs start-up time nobody needs
until a Claude call is made (a daemon running only shell jobs never pays it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.config import AnthropicConfig

if TYPE_CHECKING:
    from orchestrator.llm.anthropic import Claude


class SharedClaude:
    def __init__(self, cfg: AnthropicConfig) -> None:
        self.cfg = cfg
        self._claude: Claude | None = None

    def get(self) -> Claude:
        """The one `Claude` (one bound, one retry policy) for every caller of this daemon."""
        if self._claude is None:
            from orchestrator.llm.anthropic import Claude

            self._claude = Claude(self.cfg)
        return self._claude

    async def close(self) -> None:
        if self._claude is not None:
            await self._claude.close()
