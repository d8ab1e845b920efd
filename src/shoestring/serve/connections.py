"""The connections a server holds, and for how long: the limits a client meets before any
request of its is parsed.

uvicorn keeps a connection for as long as its client does: one that never sends a byte, or
trickles a request head a byte at a time, or sends requests and never reads the answers,
holds a socket (and, unread, an ever-growing write buffer) forever, and its
``limit_concurrency`` answers 503 to *every* request once enough such sockets are open,
health checks included. Here instead (for the protocol `fastpath` runs; docs/security.md):

- a connection must send a whole request head within ``--idle-timeout`` of opening or of its
  previous answer, however many bytes it trickles meanwhile, else it is closed (408 if it had
  begun one);
- an answer its client does not read (the transport's buffer over its high-water mark) for
  ``--idle-timeout`` closes the connection; until then no further request on it is read;
- at ``--max-connections`` a new connection closes the one that has waited longest for a
  request head, so a probe of ``/healthz`` always gets in while others only hold sockets open;
  when every connection has a request in progress the new one is answered 503.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, Protocol

from prometheus_client import Counter

# File descriptors kept for the process's own files (models, logs, the listening socket).
FD_RESERVE = 256


class Connection(Protocol):
    """What `Connections` needs of a connection's protocol."""

    loop: asyncio.AbstractEventLoop
    transport: Any

    def idle_expired(self) -> None: ...


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, or fewer when the process cannot open that many files: its
    soft descriptor limit is first raised to the hard one (as Go's runtime and nginx's
    ``worker_rlimit_nofile`` do), since a default soft limit of 1,024 would let ~1,000 sockets
    make ``accept`` fail for everyone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + FD_RESERVE:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, wanted + FD_RESERVE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE))


class Connections:
    """Every open connection, and which of them are waiting for a request head (oldest
    first, each with the timer that closes it)."""

    def __init__(self, max_connections: int, idle_timeout_s: float, closed: Counter) -> None:
        self.max_connections, self.idle_timeout_s, self._closed = (max_connections,
                                                                   idle_timeout_s, closed)
        self.live: set[Connection] = set()
        self.waiting: dict[Connection, asyncio.TimerHandle] = {}

    def opened(self, conn: Connection) -> bool:
        """A new connection: room is made by closing the longest-waiting one when at the cap;
        False when every connection has a request in progress (the caller answers 503 and
        counts it)."""
        if len(self.live) >= self.max_connections:
            oldest = next(iter(self.waiting), None)
            if oldest is None:
                return False
            self.gone(oldest)
            self.count("evicted")
            oldest.transport.close()
        self.live.add(conn)
        self.wait(conn)
        return True

    def wait(self, conn: Connection) -> None:
        """``conn`` has no request in progress: its clock for a whole request head starts."""
        self.busy(conn)
        self.waiting[conn] = conn.loop.call_later(self.idle_timeout_s, conn.idle_expired)

    def busy(self, conn: Connection) -> None:
        """``conn``'s request head is complete: it no longer waits, and is not closed for room."""
        timer = self.waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def gone(self, conn: Connection) -> None:
        self.busy(conn)
        self.live.discard(conn)

    def count(self, reason: str) -> None:
        """One connection the server closed itself, for ``reason`` (the metrics' label)."""
        self._closed.labels(reason=reason).inc()
