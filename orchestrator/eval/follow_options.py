"""What a follow is asked to do (`FollowOptions`) and what it reports while it works
(`FollowEvents`): shared by the loop (`follow`) and each checkpoint's work
(`follow_checkpoint`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval.spec import EvalOptions
from orchestrator.relay import run as relay


@dataclass
class FollowOptions:
    """How to follow. `eval` holds the evaluation options (defaults: the inventory's)."""

    keep: int | None = None
    interval: float = 60.0
    probe: bool = False
    eval: EvalOptions = field(default_factory=EvalOptions)
    results_dir: str | os.PathLike | None = None
    state_dir: str | os.PathLike | None = None
    tensorboard: str | os.PathLike | None = None  # log folder
    wandb: str | None = None  # project

    def __post_init__(self) -> None:
        """Refuse a count no follow can run with before anything connects (the eval's own
        options check themselves)."""
        if self.keep is not None and (
            isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1
        ):
            raise DflashError(f"--keep must be a whole number of at least 1, got {self.keep!r}")
        if not self.interval > 0:
            raise DflashError(f"--interval must be more than 0 seconds, got {self.interval!r}")


class FollowEvents:
    """What follow reports while it works; the CLI draws it, tests hook into it."""

    def message(self, text: str) -> None:
        pass

    def relay_progress(self, checkpoint: str) -> relay.Progress | None:
        return None

    def eval_event(self, checkpoint: str, event: dict) -> None:
        pass

    def recorded(self, entry: dict) -> None:
        pass
