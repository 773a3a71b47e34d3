"""Follow's view (`RichEvents`), apart from `progress` so a relay imports no follow loop."""

from __future__ import annotations

import time

from orchestrator.commands.output.base import err_console, plain
from orchestrator.commands.output.progress import LiveProgress, ShardProgress
from orchestrator.commands.output.relaybar import RelayProgress
from orchestrator.commands.output.slurm import SlurmShardProgress
from orchestrator.eval.follow import loop as follow_lib
from orchestrator.results import summary
from remote.protocol import JobState
from remote.protocol import metrics as registry


class RichEvents(follow_lib.FollowEvents):
    """Timestamped lines, the relay's byte bar and the eval's live bar, on stderr."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.relay_bar: RelayProgress | None = None
        self.live: LiveProgress | ShardProgress | None = None
        self.live_for: str | None = None

    def _close(self) -> None:
        if self.relay_bar is not None:
            self.relay_bar.stop()
            self.relay_bar = None
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def message(self, text: str) -> None:
        self._close()
        if self.enabled:
            err_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {plain(text)}", soft_wrap=True)

    def relay_progress(self, checkpoint: str):
        self._close()
        if not self.enabled:
            return None
        self.relay_bar = RelayProgress()
        return self.relay_bar

    def eval_event(self, checkpoint: str, event: dict) -> None:
        if not self.enabled:
            return
        if not isinstance(self.live, LiveProgress) or self.live_for != checkpoint:
            self._close()
            self.live, self.live_for = LiveProgress(True).__enter__(), checkpoint
        self.live(event)

    def shard_event(self, checkpoint: str, host: str, event: dict) -> None:
        """A Slurm array's tasks, as ``remote-eval --hosts`` shows them."""
        if not self.enabled:
            return
        if not isinstance(self.live, ShardProgress) or self.live_for != checkpoint:
            self._close()
            self.live, self.live_for = SlurmShardProgress(True).__enter__(), checkpoint
        self.live(host, event)

    def recorded(self, entry: dict) -> None:
        self._close()
        if not self.enabled:
            return
        if entry["state"] != JobState.DONE:
            err_console.print(
                f"[red]{plain(entry['checkpoint'])}: failed[/]: {plain(entry.get('error'))}",
                soft_wrap=True,
            )
            return
        head = registry.headline()
        said = [
            f"{m.header} {summary.shown(m, entry.get(m.name))}"
            for m in summary.columns([entry])
            if m.style != "count"
        ]
        said += [
            f"{summary.budget_label(head, b)} {summary.shown(head, v)}"
            for b, v in entry["ddtree"].items()
            if v is not None
        ]
        err_console.print(
            f"[bold green]{plain(entry['checkpoint'])}[/] (step {plain(entry['step'])}): "
            + plain(", ".join(said)),
            soft_wrap=True,
        )

    def close(self) -> None:
        self._close()

    def __enter__(self) -> RichEvents:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
