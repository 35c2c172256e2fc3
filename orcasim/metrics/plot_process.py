"""Drawing plots in a child process that imports matplotlib while the command simulates.

Importing matplotlib takes about as long as simulating a few hundred
requests, and drawing a figure about as long again. A command that will
write plots creates a :class:`PlotProcess` before its own work: the child
imports matplotlib and the module that draws while the parent reads its
inputs and simulates, then draws what the parent sends it. With two cores
the import costs no wall time. The child calls the same functions on the
same (pickled) data as the parent would, so the files are identical
(``tests/test_plot_process.py``).

Whenever the child cannot help, the parent draws itself: when this process
has imported matplotlib already (drawing here then costs no import, and
keeps any settings made to it), on a single core, or when the child fails
for any reason (the parent then draws, and a real error such as an
unwritable file is raised here as usual). The child ignores Ctrl-C (the
parent handles it and ends the child) and ends when its input closes.

Run as ``python -m orcasim.metrics.plot_process MODULE``: read a pickled
list of ``(function name, args)`` jobs from stdin, call
``MODULE.<name>(*args)`` for each, write a pickled ``True`` (all drawn) or
the error's text to stdout.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orcasim

#: when False, every :class:`PlotProcess` draws in this process
ENABLED = True


def worthwhile() -> bool:
    """Whether a child would save time: matplotlib not imported here yet, and two cores."""
    if "matplotlib" in sys.modules:
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores > 1


class PlotProcess:
    """Jobs for the drawing functions of one module, run in a child process when it helps.

    Use as a context manager, started before the command's work::

        with PlotProcess("orcasim.replay.plots") as plotter:
            ...                                   # simulate
            plotter.draw("latency_cdfs", path, measured, predicted, title)
            plotter.finish()                      # returns once every file is written
    """

    def __init__(self, module: str, *, child: bool | None = None) -> None:
        self.module = module
        self._jobs: list[tuple[str, tuple[Any, ...]]] = []
        if child is None:
            child = ENABLED and worthwhile()
        self._proc: subprocess.Popen[bytes] | None = self._spawn() if child else None

    @property
    def in_child(self) -> bool:
        """Whether a child process draws (else :meth:`finish` draws here)."""
        return self._proc is not None

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        env = dict(os.environ)
        root = str(Path(orcasim.__file__).resolve().parent.parent)  # this orcasim, first
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        try:
            return subprocess.Popen([sys.executable, "-m", __name__, self.module],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError:
            return None

    def draw(self, function: str, *args: Any) -> None:
        """Queue ``MODULE.<function>(*args)``; :meth:`finish` runs the queue."""
        self._jobs.append((function, args))

    def finish(self) -> None:
        """Run the queued jobs (in the child, or here should it fail) and wait for them."""
        jobs, self._jobs = self._jobs, []
        proc, self._proc = self._proc, None
        if proc is not None and _run_in(proc, jobs):
            return
        _run(self.module, jobs)

    def close(self) -> None:
        """End the child without drawing (on an error in the command)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()

    def __enter__(self) -> PlotProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _run_in(proc: subprocess.Popen[bytes], jobs: list[tuple[str, tuple[Any, ...]]]) -> bool:
    """Send ``jobs`` to the child and wait; whether it drew them all."""
    try:
        out, _ = proc.communicate(pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL))
        return proc.returncode == 0 and pickle.loads(out) is True
    except Exception:  # anything at all: the parent draws instead
        proc.kill()
        proc.wait()
        return False


def _run(module: str, jobs: list[tuple[str, tuple[Any, ...]]]) -> None:
    import importlib

    mod = importlib.import_module(module)
    for function, args in jobs:
        getattr(mod, function)(*args)


def _child(module: str, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """The child's work: import, wait for the jobs, draw them, answer."""
    import importlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from orcasim.metrics.plots import _pyplot

        _pyplot()
        importlib.import_module(module)
        jobs = pickle.load(stdin)
        _run(module, jobs)
        answer: object = True
    except Exception as err:  # reported to the parent, which draws itself
        answer = f"{type(err).__name__}: {err}"
    try:
        stdout.write(pickle.dumps(answer))
        stdout.flush()
    except OSError:  # the parent is gone
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer))
