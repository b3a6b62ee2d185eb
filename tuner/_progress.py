"""Progress for long work, on stderr: rich's live bar on a terminal; plain lines where
stderr is a pipe or a file (a CI log, `2>&1 | tee`), at most one every `every_s` seconds
and one at the end, so a piped run shows it is alive without drawing a bar."""

from __future__ import annotations

import sys
import time

__all__ = ["progress", "PlainProgress", "PIPE_WIDTH"]

#: the width of tables printed to a pipe or a file
PIPE_WIDTH = 120


class PlainProgress:
    """The part of rich.progress.Progress the CLI uses, printed as plain lines."""

    def __init__(self, fields_text: str = "", every_s: float = 10.0, stream=None):
        self.fields_text, self.every_s = fields_text, every_s
        self.stream = stream or sys.stderr
        self.tasks: dict[int, dict] = {}
        self.start = time.monotonic()
        self.last = -every_s

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            for task in self.tasks:
                self._print(task)
        return False

    def add_task(self, description: str, total=None, **fields) -> int:
        task = len(self.tasks)
        self.tasks[task] = dict(description=description, total=total, completed=0, **fields)
        return task

    def update(self, task: int, **changes) -> None:
        self.tasks[task].update(changes)
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._print(task)

    def _print(self, task: int) -> None:
        t = self.tasks[task]
        done = f"{t['completed']}" + (f"/{t['total']}" if t["total"] else "")
        extra = self.fields_text.format(**t) if self.fields_text else ""
        print(f"gemm-tune: {t['description']} {done}{', ' + extra if extra else ''}, "
              f"{time.monotonic() - self.start:.0f} s", file=self.stream, flush=True)


def progress(*columns, fields_text: str = "", disable: bool = False):
    """rich's Progress with `columns` on a terminal's stderr; PlainProgress where stderr is
    not a terminal (`fields_text` formats the task's fields into its lines)."""
    from rich.console import Console
    from rich.progress import Progress

    if disable or sys.stderr.isatty():
        return Progress(*columns, console=Console(stderr=True), transient=True,
                        disable=disable)
    return PlainProgress(fields_text)
