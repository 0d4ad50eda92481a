"""One OS thread for all torch work in a process that also runs other threads (a web UI, an HTTP server).

On a CPU, torch's intra-op parallelism is OpenMP (libgomp), and libgomp gives every OS thread that
starts a parallel region its own team of worker threads. Once two OS threads own teams and the
process has more OpenMP threads than CPUs, libgomp cuts its spin-waiting short, so every parallel
region pays for waking its workers: on a 2-CPU machine the same ``generate`` decodes at about half
speed in a second thread (measured: 22.4 tok/s in the main thread, 12.2 in a worker). So a served
process does all its torch work, loading included, in one thread:
``adaflash serve`` in the main thread (:meth:`~adaflash_hf.serving.scheduler.Scheduler.run`), the
demo in the thread of :func:`torch_thread`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class TorchThread:
    """A single worker thread that runs callables (and advances iterators) for other threads."""

    def __init__(self, name: str = "adaflash-torch"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` in the torch thread and return (or raise) what it did."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items``, each computed in the torch thread (a generator runs there step by step)."""
        iterator = self.call(iter, items)
        while True:
            item = self.call(next, iterator, _DONE)
            if item is _DONE:
                return
            yield item


_shared: TorchThread | None = None
_lock = threading.Lock()


def torch_thread() -> TorchThread:
    """The process's shared :class:`TorchThread` (started on first use)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = TorchThread()
        return _shared
