"""What keeps idle and slow clients of ``ctxkit serve`` from starving the others.

uvicorn alone (issue 43) sets no deadline for a request's line and headers or its body,
so a connection that sends nothing, or a byte now and then, holds its socket and file
descriptor for ever; its accept loop takes pending connections until the process runs out
of descriptors (uvloop then closes its listening handle; asyncio logs a traceback per
retry: 264,129 log lines in 33 s), and fresh clients wait in vain; and under httptools
it has no size limit on the headers (a 1 MB header is buffered whole, then reset).

This module replaces uvicorn's listening server with a small front of its own; uvicorn
still parses HTTP and runs the app:

* :class:`Listener` accepts connections itself (``loop.add_reader`` on the listening
  sockets) and hands each to uvicorn's protocol with ``loop.connect_accepted_socket``.
  It keeps the open connections under ``max_connections``, below the open-file limit.
  Past the cap, a new connection takes the place of the connection idle the longest
  without having begun a request, the way nginx reuses its "reusable" connections;
  when every connection is busy, the new one gets a 503 and is closed at once.
* :func:`protocol_class` subclasses uvicorn's httptools protocol with a deadline per
  connection (header, body; uvicorn's own keep-alive timer does the idle time between
  requests) and the header-size limit, answering 408 and 431 with ``{"error": ...}``.
* its log lines (accept errors, a full server, timeouts) go through
  :class:`~ctxkit.inference.serve_limits.BurstLog`: one line when a burst starts, one
  summary when it has stopped, not a line per event.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import functools
import http
import json
import logging
import signal
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

from ..core.errors import UserError
from .serve_limits import BurstLog

__all__ = ["ConnectionLimits", "Listener", "bind_sockets", "open_file_limit", "protocol_class", "server_class"]

DEFAULT_MAX_CONNECTIONS = 4096  # the cap when the open-file limit allows more
# File descriptors kept for everything but client connections: the listening sockets,
# the event loop's own (epoll, eventfd), stdio, the files torch and the tokenizer open,
# a refused connection's moment, and EVICT_SLACK evicted connections still closing.
MIN_RESERVE = 48
EVICT_SLACK = 8  # evicted connections allowed to be still closing while their successors are taken
ACCEPT_BATCH = 32  # accepts per wake-up: the event loop keeps serving requests during a flood
ACCEPT_PAUSE_S = 0.1  # after EMFILE/ENFILE, how long the listening sockets rest
LINGER_S = 2.0  # after an error answer, how long the rest of the request is read and dropped
LINGER_BYTES = 16 << 20
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# A connection's states. IDLE: no byte of a request (a new connection, or a kept-alive one
# between requests): the only state in which it may be evicted. CLOSING: an error answer
# is sent; what the client still sends is read and dropped.
IDLE, HEAD, BODY, BUSY, CLOSING = "idle", "head", "body", "busy", "closing"


def open_file_limit() -> Optional[int]:
    """The process's soft open-file limit (``ulimit -n``); None if unlimited or unknown."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft


def _reserve(limit: int) -> int:
    return max(MIN_RESERVE, limit // 8)


def _check(limits, name: str, types, above, what: str) -> None:
    value = getattr(limits, name)
    if isinstance(value, bool) or not isinstance(value, types) or not above < value < float("inf"):
        raise UserError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")


@dataclasses.dataclass
class ConnectionLimits:
    """The HTTP front's settings (``ctxkit serve`` flags) and its counters.

    Args:
        header_timeout: seconds for a request's line and headers, counted from the
            connection's opening (first request) or from the request's first byte (a
            kept-alive connection's next one). A connection that sent nothing is closed
            silently; one that sent part of a head gets 408.
        body_timeout: seconds for the whole body, counted from the end of the headers (408).
        keep_alive_timeout: seconds a connection may stay open between two requests.
        max_header_bytes: largest request line plus headers (431).
        max_connections: most open client connections; None: the open-file limit less a
            reserve (an eighth, at least 48), at most ``DEFAULT_MAX_CONNECTIONS``.
        file_limit: the open-file limit (default: the process's, :func:`open_file_limit`).

    Raises:
        UserError: a timeout or size not > 0, or more connections than the open-file limit
            leaves room for.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_header_bytes: int = 32768
    max_connections: Optional[int] = None
    file_limit: Optional[int] = dataclasses.field(default_factory=open_file_limit)
    stats: Dict[str, Any] = dataclasses.field(init=False, default_factory=lambda: {
        "open": 0, "accepted": 0, "refused": 0, "evicted": 0, "header_too_large": 0, "accept_errors": 0,
        "timed_out": {"idle": 0, "header": 0, "body": 0}})

    def __post_init__(self):
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            _check(self, name, (int, float), 0, "a number of seconds > 0")
        _check(self, "max_header_bytes", int, 1023, "an integer >= 1024")
        if self.max_connections is not None:
            _check(self, "max_connections", int, 0, "an integer >= 1")
        most = None if self.file_limit is None else self.file_limit - _reserve(self.file_limit)
        if most is not None and most < 1:
            raise UserError(f"the open-file limit ({self.file_limit}) leaves no room for connections: "
                            f"raise it (ulimit -n) above {_reserve(self.file_limit)}")
        if self.max_connections is None:
            self.max_connections = DEFAULT_MAX_CONNECTIONS if most is None else min(DEFAULT_MAX_CONNECTIONS, most)
        elif most is not None and self.max_connections > most:
            raise UserError(f"--max-connections {self.max_connections} does not fit the open-file limit of {self.file_limit} "
                            f"({_reserve(self.file_limit)} kept for the process): give at most {most}, or raise the "
                            "limit (ulimit -n)")

    def health(self) -> dict:
        """The settings and live counters, as ``/health`` shows them."""
        return {"max_connections": self.max_connections, "open_file_limit": self.file_limit,
                "header_timeout_s": self.header_timeout, "body_timeout_s": self.body_timeout,
                "keep_alive_timeout_s": self.keep_alive_timeout, "max_header_bytes": self.max_header_bytes,
                "stats": {**self.stats, "timed_out": dict(self.stats["timed_out"])}}


def bind_sockets(host: str, port: int, backlog: int) -> List[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as ``loop.create_server`` binds.

    Raises:
        OSError: the address is taken or cannot be resolved.
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: List[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: IPv6 only, IPv4 gets its own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]  # port 0: the free port of the first address, for all of them
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _answer(status: int, message: str, default_headers=()) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 answer with ``{"error": message}``."""
    body = json.dumps({"error": message}).encode()
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
    if status == 503:
        lines.append(b"retry-after: 1")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class Listener:
    """The accept loop, in place of the server ``loop.create_server`` would start.

    uvicorn's shutdown calls :meth:`close` and :meth:`wait_closed`, as on an asyncio server.

    Args:
        sockets: bound, listening, non-blocking sockets (:func:`bind_sockets`).
        protocol_factory: ``protocol_factory(listener)``, a new connection's protocol
            (a :func:`protocol_class` instance).
        limits: the settings; its ``stats`` are kept up to date.
        log_event: ``log_event(event, **fields)``.
    """

    def __init__(self, sockets: List[socket.socket], protocol_factory: Callable, limits: ConnectionLimits,
                 log_event: Callable[..., None]):
        self.sockets, self.protocol_factory, self.limits = sockets, protocol_factory, limits
        self.stats = limits.stats
        self.log = BurstLog(log_event)
        # Connections that may be evicted, the longest idle first (dicts keep insertion order).
        self.idle: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self._tasks: set = set()
        self._paused = False
        self._closed = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def start(self) -> None:
        """Start accepting on the running loop."""
        self._loop = asyncio.get_running_loop()
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (open connections are left alone)."""
        if self._closed:
            return
        self._closed = True
        for sock in self.sockets:
            if self._loop is not None and not self._paused:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self.log.close()

    async def wait_closed(self) -> None:
        """Nothing to wait for: :meth:`close` closes the sockets at once."""

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            if self.idle and self.stats["open"] >= self.limits.max_connections + EVICT_SLACK:
                # Evicted connections are still closing: the next ones wait in the backlog for
                # their places (this runs again on the next loop iteration), not refused.
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while it waited in the backlog
                continue
            except OSError as err:  # EMFILE above all; retrying at once would fail (and log) again
                self._accept_failed(err)
                return
            if self.stats["open"] < self.limits.max_connections or self._evict():
                self._adopt(conn)
            else:
                self._refuse(conn)

    def _accept_failed(self, err: OSError) -> None:
        # Above all EMFILE: something else holds the descriptors the reserve was for. Let
        # the listening sockets rest a moment (new clients wait in the backlog, not
        # refused) and, out of descriptors, free one from an idle connection if there is one.
        self.stats["accept_errors"] += 1
        self.log.note("accept_error", error=f"{errno.errorcode.get(err.errno, err.errno)}: {err.strerror}",
                      max_connections=self.limits.max_connections)
        if self.idle and err.errno in _OUT_OF_RESOURCES:
            self._evict_one()
        self._paused = True
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())
        self._loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        if self._closed or not self._paused:
            return
        self._paused = False
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _evict(self) -> bool:
        """Make room by closing the connection idle the longest; False if none may go.

        An evicted connection holds its descriptor until its close completes (the next
        loop iteration): at most EVICT_SLACK of them over the cap, inside the reserve.
        """
        if not self.idle or self.stats["open"] >= self.limits.max_connections + EVICT_SLACK:
            return False
        self._evict_one()
        self.log.note("connections_full", max_connections=self.limits.max_connections)
        return True

    def _evict_one(self) -> None:
        protocol, _ = self.idle.popitem(last=False)
        self.stats["evicted"] += 1
        protocol.evict()

    def _refuse(self, conn: socket.socket) -> None:
        self.stats["refused"] += 1
        self.log.note("connections_full", max_connections=self.limits.max_connections)
        try:
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                conn.recv(65536)  # what the client sent: closing with it unread would reset, and lose the 503
            conn.send(_answer(503, f"the server has {self.stats['open']} connections open, all busy "
                                   f"(--max-connections {self.limits.max_connections}); retry later"))
        except OSError:
            pass
        conn.close()

    def _adopt(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats["open"] += 1  # from now until the protocol's connection_lost
        self.stats["accepted"] += 1
        protocol = self.protocol_factory(self)
        # A client whose request is already here is not idle, even before the protocol reads
        # it (a few loop iterations on): under a flood of connections it would be evicted first.
        with contextlib.suppress(OSError):
            protocol.sent_early = bool(conn.recv(1, socket.MSG_PEEK))
        task = self._loop.create_task(self._connect(conn, protocol))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket, protocol) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except Exception as err:  # noqa: BLE001 - logged; the connection could not be set up (its client left)
            if not protocol.counted:
                self.stats["open"] -= 1
                conn.close()
            self.log.note("connection_error", error=f"{type(err).__name__}: {err}")

    # Called by the protocols.
    def closed(self, protocol) -> None:
        """A connection is gone: its descriptor is free."""
        self.stats["open"] -= 1
        self.idle.pop(protocol, None)

    def timed_out(self, kind: str) -> None:
        """A connection was closed for a deadline: ``idle``, ``header`` or ``body``."""
        self.stats["timed_out"][kind] += 1
        self.log.note("timeout", kind=kind, timeout_s=self.limits.body_timeout if kind == "body" else self.limits.header_timeout)


@functools.cache
def protocol_class():
    """uvicorn's httptools protocol with deadlines, the header-size limit and the listener's
    bookkeeping; instances take ``listener=`` besides uvicorn's arguments.

    A subclass, built on first use: uvicorn is the ``serve`` extra, imported when a server
    starts. It overrides the parser callbacks it needs and calls uvicorn's own in each; the
    uvicorn internals it reads (``cycle``, ``pipeline``, ``flow``, the keep-alive timer)
    were checked against uvicorn 0.54; tests/test_serve_conn.py runs them.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedProtocol(HttpToolsProtocol):
        """One connection: uvicorn's protocol plus a deadline and a state (IDLE ... CLOSING)."""

        def __init__(self, *args, listener: Listener, **kwargs):
            super().__init__(*args, **kwargs)
            self.listener, self.limits = listener, listener.limits
            self.state = IDLE
            self.counted = False  # connection_made ran: connection_lost uncounts it
            self.sent_early = False  # bytes of a request were waiting when it was accepted
            self.deadline: Optional[asyncio.TimerHandle] = None
            self.head_bytes = 0  # raw bytes of an unfinished head, counted as they arrive
            self.head_size = 0  # the head's size from the parser's callbacks
            self.head_too_large = False
            self.lingered = 0

        # Transport events.
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.counted = True  # since its accept; connection_lost uncounts it
            if not self.sent_early:
                self.listener.idle[self] = None
            self._arm(self.limits.header_timeout, "header")  # the first request's head: from the opening

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self.counted:
                self.counted = False
                self.listener.closed(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.state == CLOSING:  # drop it; enough of it ends the wait for the client to finish
                self.lingered += len(data)
                if self.lingered > LINGER_BYTES:
                    self.transport.close()
                return
            if self.state == IDLE:
                self._start_head()
            if self.state == HEAD:
                self.head_bytes += len(data)
            super().data_received(data)
            # Still in the head after all of it: the bytes are all head, and httptools holds
            # an unfinished header in memory, so this check comes before it grows further.
            if self.state == HEAD and self.head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
                self._head_too_large()

        # Parser callbacks (httptools calls them from data_received).
        def on_message_begin(self) -> None:
            if self.state != HEAD:  # a pipelined request, begun while the previous one is answered
                self._start_head()
            self.head_size = 16  # the request line's method, spaces, version and line ends, about
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self.state, self.head_bytes = BODY, 0
            self._arm(self.limits.body_timeout, "body")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self.state = BUSY  # the app has the request: its time is the batcher's business
            self._disarm()
            super().on_message_complete()
            if self.cycle.response_complete and not self.pipeline and not self.transport.is_closing():
                # Answered before its body was all in (a 413 past what RequestGuard drains):
                # uvicorn's keep-alive timer, armed then, was cancelled by the body's bytes.
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
                self._idle()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # uvicorn armed its keep-alive timer: no request of this connection is pending.
            if self.state == BUSY and self.timeout_keep_alive_task is not None:
                self._idle()

        def send_400_response(self, msg: str) -> None:
            # httptools reports an exception raised in a callback as a parse error.
            if self.head_too_large:
                self._head_too_large()
            else:
                super().send_400_response(msg)

        # Ours.
        def _idle(self) -> None:
            self.state = IDLE
            self.listener.idle[self] = None

        def _count_head(self, size: int) -> None:
            self.head_size += size
            if self.head_size > self.limits.max_header_bytes:
                self.head_too_large = True
                raise ValueError("request line and headers too large")  # stops the parser

        def _start_head(self) -> None:
            self.state, self.head_bytes = HEAD, 0
            self.listener.idle.pop(self, None)
            if self.deadline is None:  # a kept-alive connection's next request: its own deadline
                self._arm(self.limits.header_timeout, "header")

        def _head_too_large(self) -> None:
            self.listener.stats["header_too_large"] += 1
            self.listener.log.note("header_too_large", max_header_bytes=self.limits.max_header_bytes)
            self._refuse(431, f"request line and headers over {self.limits.max_header_bytes} bytes (--max-header-bytes)")

        def _arm(self, seconds: float, kind: str) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(seconds, self._expired, kind)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expired(self, kind: str) -> None:
            self.deadline = None
            if self.state == CLOSING:  # the linger is over
                self.transport.close()
            elif self.state == IDLE:  # never sent a byte: nobody to answer
                self.listener.timed_out("idle")
                self.listener.idle.pop(self, None)
                self.transport.close()
            else:
                self.listener.timed_out(kind)
                if kind == "header":
                    self._refuse(408, f"request line and headers not received within {self.limits.header_timeout:g} s "
                                      "(--header-timeout)")
                else:
                    self._refuse(408, f"request body not received within {self.limits.body_timeout:g} s (--body-timeout)")

        def evict(self) -> None:
            """Close this idle connection to make room for a new one (the listener's choice)."""
            self._disarm()
            self._unset_keepalive_if_required()
            self.transport.close()

        def _refuse(self, status: int, message: str) -> None:
            """Answer ``status`` and close, after reading (and dropping) what the client still
            sends for up to LINGER_S: closing with unread bytes would reset the connection
            and the client could lose the answer before reading it."""
            cycle, state = self.cycle, self.state
            self.state = CLOSING
            self.listener.idle.pop(self, None)
            waiting_for_body = state == BODY and cycle is not None and not cycle.response_started and not self.pipeline
            if waiting_for_body:  # the app gets a disconnect, and what it sends is dropped
                cycle.disconnected = True
                cycle.message_event.set()
            elif state == BODY or (cycle is not None and not cycle.response_complete):
                # An answer was sent before the body was in (a 413), or one is on its way (a
                # pipelined predecessor's): no answer of ours fits; the deadline ends the connection.
                self.transport.close()
                return
            self.transport.write(_answer(status, message, self.server_state.default_headers))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.flow.resume_reading()
            self._arm(LINGER_S, "linger")

    return GuardedProtocol


def server_class(log_event: Callable[..., None]):
    """uvicorn's ``Server`` listening through :class:`Listener`; instances take
    ``(config, limits)``, ``limits`` a :class:`ConnectionLimits`.

    It also ends a graceful stop with status 0: uvicorn re-raises the signal, and the
    process would end with 128 + signal. ``log_event`` writes ``listening`` and ``stopping``.
    """
    import uvicorn  # the serve extra, imported when a server starts

    class Server(uvicorn.Server):
        """uvicorn's server: this module's front in place of ``loop.create_server``."""

        def __init__(self, config, limits: ConnectionLimits):
            super().__init__(config)
            self.limits = limits

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets=None) -> None:
            # uvicorn's startup (lifespan first, exit status 3 when it or the bind fails),
            # listening through serve_conn.Listener. uvicorn's shutdown closes it as a server.
            await self.lifespan.startup()
            if self.lifespan.should_exit:
                sys.exit(3)
            config = self.config
            try:
                bound = bind_sockets(config.host, config.port, config.backlog)
            except OSError as exc:
                logging.getLogger("uvicorn.error").error(exc)
                await self.lifespan.shutdown()
                sys.exit(3)
            protocol = protocol_class()

            def new_connection(listener):
                return protocol(config=config, server_state=self.server_state, app_state=self.lifespan.state,
                                listener=listener)

            listener = Listener(bound, new_connection, self.limits, log_event)
            listener.start()
            self.servers = [listener]
            self.started = True
            host, port = bound[0].getsockname()[:2]  # only now is the port bound (port 0 picks a free one)
            log_event("listening", host=host, port=port)

        def handle_exit(self, sig, frame) -> None:
            log_event("stopping", signal=signal.Signals(sig).name)
            super().handle_exit(sig, frame)

    return Server
