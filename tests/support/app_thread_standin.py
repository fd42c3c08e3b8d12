"""A stand-in server whose FastAPI ``app`` runs in a thread of the test's process (``AppThread``, a free
loopback port): the engine stand-ins in tests/support subclass it and build ``self.app``."""

from __future__ import annotations

from typing import Any


class ThreadedStandin:
    app: Any
    _thread: Any = None
    url = ""

    def start(self) -> str:
        from agentgym.server.handles import AppThread

        self._thread = AppThread(self.app)
        self.url = self._thread.url
        return self.url

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
