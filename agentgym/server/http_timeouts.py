"""Read and write deadlines for uvicorn connections, so slow or stalled clients cannot pile up.

uvicorn closes a keep-alive connection that stays idle after a response, but not one that sends
a request slowly (or nothing at all after connecting), nor one that stops reading its response:
each holds a socket and a file descriptor until the client goes away. Seen on the gateway:
2,000 slow sockets, 2,000 open files, forever.

``timed_protocol(read_timeout, write_timeout)`` is a uvicorn ``http`` protocol class (pass it as
``uvicorn.Config(http=...)``) that aborts a connection when

* a request (from its first byte, or from the moment the connection opened) is not fully
  received, headers and body, within ``read_timeout`` seconds;
* the client leaves the server's write buffer full (it stopped reading) for ``write_timeout``
  seconds.

The time the application takes to answer is not bounded here: generation may take minutes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

READ_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 60.0


def _base_protocol() -> type:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # httptools not installed: uvicorn's pure-Python h11 protocol
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def timed_protocol(read_timeout: float = READ_TIMEOUT_S, write_timeout: float = WRITE_TIMEOUT_S) -> type:
    """A uvicorn HTTP protocol class enforcing the two deadlines (seconds)."""
    base: Any = _base_protocol()

    class TimedHttpProtocol(base):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._read_timer: asyncio.TimerHandle | None = None
            self._write_timer: asyncio.TimerHandle | None = None
            self._start_request()

        def _start_request(self) -> None:
            """The client owes a whole request within ``read_timeout`` from now."""
            self._receiving = True
            self._cycle_before = self.cycle
            self._read_deadline = time.monotonic() + read_timeout
            self._arm_read(read_timeout)

        def _arm_read(self, delay: float) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self.loop.call_later(max(delay, 0.0), self._check_read)

        def _request_received(self) -> bool:
            cycle = self.cycle
            return cycle is not None and cycle is not self._cycle_before and not cycle.more_body

        def _check_read(self) -> None:
            self._read_timer = None
            if self.transport.is_closing() or not self._receiving or self._request_received():
                return
            left = self._read_deadline - time.monotonic()
            if left > 0.01:
                self._arm_read(left)
                return
            self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if not self._receiving:  # the first bytes of the next request on a kept-alive connection
                self._start_request()
            super().data_received(data)

        def on_response_complete(self) -> None:
            unread = self.cycle is not None and self.cycle.more_body
            super().on_response_complete()
            if not unread:
                self._idle()
            elif not hasattr(base, "on_message_complete") and not self.transport.is_closing():
                self.transport.close()  # h11: no hook tells when the rest arrives; do not reuse the connection
            # else: answered before its whole body arrived (a 401, a 413): uvicorn reads and drops the
            # rest, which must still come by the request's deadline

        def on_message_complete(self) -> None:  # httptools: the request's last byte arrived
            super().on_message_complete()
            if self.cycle is not None and self.cycle.response_complete:
                self._idle()

        def _idle(self) -> None:
            self._receiving = False  # uvicorn's keep-alive timeout takes over
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout, self._write_stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_stalled(self) -> None:
            self._write_timer = None
            if not self.transport.is_closing():
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._read_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            self._read_timer = self._write_timer = None
            super().connection_lost(exc)

    return TimedHttpProtocol
