"""Progress of long runs on a terminal: simulated time and requests done, from a side thread.

The simulation loop does nothing for it: a daemon thread wakes a few times a
second, reads the clock and the recorder of the model being run (plain
attribute reads), and rewrites one status line. Nothing is shown unless the
stream is a terminal, so piped output and files stay clean.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from orcasim.simulation import Model


class Progress:
    """A status line ``variant: t=…, done/total requests`` while runs go on (a context manager).

    Pass :meth:`watch` as ``on_model`` to :func:`orcasim.simulate`.
    """

    def __init__(self, stream: TextIO, interval: float = 0.5, force: bool = False) -> None:
        self.stream = stream
        self.interval = interval
        self.enabled = force or bool(getattr(stream, "isatty", lambda: False)())
        self._current: tuple[str, Model, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def watch(self, name: str, model: Model, num_requests: int) -> None:
        """Follow ``model`` (variant ``name``, ``num_requests`` requests) from now on."""
        self._current = (name, model, num_requests)

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="orcasim-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()

    def line(self) -> str | None:
        """The status line of the run being followed (``None`` before the first)."""
        cur = self._current
        if cur is None:
            return None
        name, model, total = cur
        done = model.recorder.num_recorded
        return f"{name}: t={model.env.now:,.1f} s, {done:,}/{total:,} requests done"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            text = self.line()
            if text is None:
                continue
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._width = len(text)
