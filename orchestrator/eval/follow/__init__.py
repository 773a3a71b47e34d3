"""Following a training run: the loop, one checkpoint, its folder (docs/follow.md)."""
