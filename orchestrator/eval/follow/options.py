"""What a follow is asked to do and what it reports while it works."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval.spec import EvalOptions, ground_truth_note
from orchestrator.inventory import Inventory
from orchestrator.relay import run as relay
from remote.protocol import COUNT


@dataclass
class FollowOptions:
    """How to follow. `eval` holds the evaluation options (defaults: the inventory's)."""

    keep: int | None = None
    interval: float = 60.0
    probe: bool = False
    eval: EvalOptions = field(default_factory=EvalOptions)
    results_dir: str | os.PathLike | None = None
    state_dir: str | os.PathLike | None = None
    tensorboard: str | os.PathLike | None = None
    wandb: str | None = None

    def __post_init__(self) -> None:
        """Refuse a count no follow can run with, before anything connects."""
        if self.keep is not None and not COUNT(self.keep):
            raise DflashError(COUNT.message("--keep", self.keep))
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

    def shard_event(self, checkpoint: str, host: str, event: dict) -> None:
        """An event of a sharded checkpoint's task, by label (``login#0``, ``login#gt``)."""

    def recorded(self, entry: dict) -> None:
        pass


@dataclass
class FollowRequest:
    """Where from, where to and how; `notes`: defaults it will take."""

    inventory: Inventory
    source: str
    dest: str
    options: FollowOptions
    notes: list[str] = field(default_factory=list)


def follow_request(
    inventory: Inventory,
    source: str | None = None,
    dest: str | None = None,
    *,
    keep: int | None = None,
    interval: float = 60.0,
    probe: bool = False,
    eval: EvalOptions | None = None,
    results_dir: str | os.PathLike | None = None,
    state_dir: str | os.PathLike | None = None,
    tensorboard: str | os.PathLike | None = None,
    wandb: str | None = None,
) -> FollowRequest:
    """The request, hosts and `keep` defaulting to the inventory's; none is one line."""
    src = source or inventory.defaults.relay_from
    dst = dest or inventory.defaults.relay_to
    if not src or not dst:
        raise DflashError(
            "follow needs --from TRAINER and --to EVAL_HOST (or "
            "defaults.relay_from and defaults.relay_to in the inventory)"
        )
    options = FollowOptions(
        keep=keep if keep is not None else inventory.defaults.keep,
        interval=interval,
        probe=probe,
        eval=eval or EvalOptions(),
        results_dir=results_dir,
        state_dir=state_dir,
        tensorboard=tensorboard,
        wandb=wandb,
    )
    notes = [ground_truth_note(spec, options.eval) for spec in inventory.expand([dst])[:1]]
    return FollowRequest(inventory, src, dst, options, [n for n in notes if n])
