"""The served process: uvicorn in a background thread beside the engine, and a graceful drain on signals.

:func:`serve` runs the engine in the calling (main) thread and the HTTP server in a background one.
The first SIGTERM or SIGINT starts a drain: the scheduler admits no new request (HTTP 503 with
``Retry-After``; ``/health`` turns 503 so a load balancer moves on), the requests it took finish
until ``drain_timeout`` seconds have passed, what is left ends "cancelled", the OPD trainer stops,
uvicorn closes after sending the last responses, and :func:`serve` returns. A second signal ends the
process at once (exit status 128 + the signal's number).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

UVICORN_SHUTDOWN_S = 5  # after the engine ends: seconds uvicorn may take to send the last responses


class ServerThread:
    """uvicorn serving ``app`` in a background thread (port 0: a free one); ``with`` gives its base URL."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.host = host
        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=UVICORN_SHUTDOWN_S)
        )
        self.thread = threading.Thread(target=self.server.run, name="adaflash-http", daemon=True)
        self.port: int | None = None

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if not self.thread.is_alive():  # uvicorn logs why (a port in use, say) and exits its thread
                raise RuntimeError(f"the HTTP server did not start on {self.host}; see the log above.")
            if time.time() > deadline:
                raise RuntimeError("the HTTP server did not start within 30 s.")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(UVICORN_SHUTDOWN_S + 5)


class DrainOnSignal:
    """Signal handler: the first signal drains ``scheduler`` within ``drain_timeout`` s, a second one
    calls ``exit_now(128 + signum)`` (``os._exit``: no clean-up, at once)."""

    def __init__(self, scheduler, drain_timeout: float, exit_now=os._exit):
        self.scheduler, self.drain_timeout, self.exit_now = scheduler, drain_timeout, exit_now
        self.signals = 0

    def __call__(self, signum, frame=None) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals > 1:
            logger.warning("%s again: exiting now, without finishing the requests in flight", name)
            self.exit_now(128 + signum)
            return
        logger.info(
            "%s: stopping; finishing the requests in flight (up to %g s; send it again to exit at once)",
            name,
            self.drain_timeout,
        )
        self.scheduler.drain(self.drain_timeout)

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self)


def serve(scheduler, app, host: str, port: int, drain_timeout: float) -> None:
    """Serve ``app`` over ``scheduler`` on ``host:port`` until a signal drains it (main thread only).

    The engine runs in this thread, the thread that loaded the models, and uvicorn in a background
    thread: one OS thread does all torch work, which on a few-core CPU decodes about twice as fast as
    an engine thread beside a main thread that ran torch (libgomp; :mod:`.torch_thread`)."""
    scheduler.calibrate()  # here, before the port opens: no request waits behind the verify-cost profile
    DrainOnSignal(scheduler, drain_timeout).install()

    with contextlib.ExitStack() as http:

        def open_port() -> None:  # once the scheduler admits requests: the first one cannot find it closed
            url = http.enter_context(ServerThread(app, host=host, port=port, log_level="info"))
            logger.info("serving %r (context %d tokens) on %s/v1", scheduler.model_name, scheduler.max_context, url)

        try:
            scheduler.run(on_start=open_port)  # returns once drained (or stopped)
            logger.info("stopping: the engine has ended; closing the HTTP server")
        finally:
            scheduler.stop()  # stops the OPD trainer too
