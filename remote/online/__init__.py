"""Online acceptance: a serving engine beside the offline walk (docs/online.md)."""
