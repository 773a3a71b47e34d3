"""The relay's live view: a rich byte bar (bytes, rate, time left, files done) on stderr,
so stdout stays for ``--json``; what it does off a terminal: `progress`'s module
docstring. Apart from the eval's views, so a relay imports none of them."""

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

    def start(self, total_bytes: int, total_files: int) -> None:
        if total_files == 0:
            return
        self.total_files = total_files
        self.bar.start()
        self.task = self.bar.add_task("relay", total=total_bytes, files=f"0/{total_files} files")

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
        if self.task is not None:
            self.bar.stop()

    def __enter__(self) -> RelayProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
