"""A byte progress bar (bytes, speed, ETA) on stderr, silent when stderr is not a terminal."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@contextmanager
def byte_progress(total: int, description: str, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n_bytes)`; a no-op when disabled or not on a terminal (CI logs, pipes)."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda n: None
        return
    columns = (
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
