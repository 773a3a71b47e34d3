"""The relay's byte bar on stderr, apart from the eval's views so a relay imports none."""

from __future__ import annotations

import threading

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from orchestrator.commands.output.base import err_console, plain
from orchestrator.commands.output.ticker import Ticker, duration
from orchestrator.relay import run as relay_lib


class RelayProgress(relay_lib.Progress):
    """A rich bar: bytes, rate, time left, files done (on stderr, stdout stays for --json)."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]relay"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[files]}"),
            console=err_console,
            transient=False,
        )
        self.task = None
        self.files = 0
        self.total_files = 0
        self.lock = threading.Lock()
        self.ticker = Ticker(self.tick_line)

    def start(self, total_bytes: int, total_files: int) -> None:
        if total_files == 0:
            return
        self.total_files = total_files
        self.bar.start()
        self.task = self.bar.add_task("relay", total=total_bytes, files=f"0/{total_files} files")
        self.ticker.start()

    def tick_line(self) -> str | None:
        if self.task is None:
            return None
        task = self.bar.tasks[self.task]
        gib = 2**30
        line = f"relay: {task.completed / gib:.2f} of {(task.total or 0) / gib:.2f} GiB"
        line += f", {self.files}/{self.total_files} files"
        if task.speed:
            line += f", {task.speed / 2**20:,.1f} MiB/s"
        if task.time_remaining is not None:
            line += f", about {duration(task.time_remaining)} left"
        return line

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, advance=nbytes)

    def file_done(self, checkpoint: str, path: str) -> None:
        with self.lock:
            self.files += 1
        if self.task is not None:
            self.bar.update(self.task, files=f"{self.files}/{self.total_files} files")

    def message(self, text: str) -> None:
        self.bar.console.print(f"[yellow]{plain(text)}[/]", soft_wrap=True)

    def stop(self) -> None:
        self.ticker.stop()
        if self.task is not None:
            self.bar.stop()

    def __enter__(self) -> RelayProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
