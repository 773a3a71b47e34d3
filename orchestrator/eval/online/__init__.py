"""``dflash online``: a serving engine's tau beside the offline walk (docs/online.md)."""
