"""The viewer's network edge: ports, websockets' log noise, and ending
connections promptly when the viewer stops."""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from typing import Any

from ..errors import SplatInputError

#: Seconds websocket clients get for the closing handshake when the server
#: stops, before their connections are aborted (see :func:`end_connections`).
CLOSE_GRACE_S = 0.5


def check_port(port: int) -> int:
    """``port`` if it is a TCP port number (0..65535; 0: any free port), else SplatInputError."""
    if not 0 <= int(port) <= 65535:
        raise SplatInputError(f"port {port}: must be 0..65535 (0: any free port)")
    return int(port)


def pick_port(host: str, port: int) -> int:
    """``port`` if it can be bound on ``host``, else a free port chosen by the OS.

    Only a hint: another process may take the port before the server binds it
    (viser then tries the next ones), so use the server's own port afterwards."""
    check_port(port)
    last = None
    for candidate in (port, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, candidate))
            except OSError as e:
                last = e
                continue
            return int(s.getsockname()[1])
    raise SplatInputError(f"cannot serve on {host}: {last.strerror or last}")


class _NoHandshakeErrors(logging.Filter):
    """Drops websockets' "opening handshake failed" error, a traceback on
    stderr for every connection that closes before sending a whole HTTP
    request (a browser's unused pre-connected socket, a port check): the
    client's doing, nothing for the viewer's user to act on.  viser adds the
    same filter itself, but only once a first page request has arrived."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "opening handshake failed"


def quiet_handshake_errors() -> None:
    """Install :class:`_NoHandshakeErrors` on websockets' server logger (once)."""
    log = logging.getLogger("websockets.server")
    if not any(isinstance(f, _NoHandshakeErrors) for f in log.filters):
        log.addFilter(_NoHandshakeErrors())


def url_of(host: str, port: int) -> str:
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "localhost", "") else host
    return f"http://{shown}:{port}"


def end_connections(server: Any, grace: float) -> None:
    """End ``server``'s (a viser server) connections that are not websockets now, and every
    connection still open ``grace`` seconds from now.

    Stopping the websockets server waits for every connection handler to
    end, and a connection that never became a websocket -- a browser's
    idle keep-alive or pre-connected socket, any plain HTTP client -- ends
    only at websockets' 10 s ``open_timeout``; a websocket client that
    does not answer the closing handshake (a frozen tab, a bare socket)
    holds it for the 10 s ``close_timeout``.  viser's ``stop()`` gives its
    server thread 1 s + 5 s and then abandons it, so Ctrl+C would take 6-7 s
    and the process would exit with that thread still running ("Server
    stopped" never printed).  Here the handshake-stage handlers are
    cancelled (websockets' own path for a cancelled handshake: it aborts
    the connection, silently), and after ``grace`` -- the closing
    handshake of a live browser takes milliseconds -- the remaining
    connections are aborted, which ends their closing handshake and
    viser's handler (it runs its disconnect teardown), so the server
    thread finishes."""
    loop = getattr(getattr(server, "_websock_server", None), "_background_event_loop", None)
    if loop is None:  # another viser layout: its own stop() decides how long it takes
        return
    from websockets.protocol import State

    def connections():  # (handler task, connection) of every connection; on the server's loop
        for task in asyncio.all_tasks(loop):
            coro = task.get_coro()
            if getattr(coro, "__qualname__", "") == "Server.conn_handler":
                yield task, inspect.getcoroutinelocals(coro).get("connection")

    def cancel_handshakes() -> None:
        for task, connection in connections():
            if getattr(getattr(connection, "protocol", None), "state", None) is not State.OPEN:
                task.cancel()

    def abort_all() -> None:
        for task, connection in connections():
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
            else:
                task.cancel()

    try:  # both run before the stop request that server.stop() queues after them
        loop.call_soon_threadsafe(cancel_handshakes)
        loop.call_soon_threadsafe(loop.call_later, grace, abort_all)
    except RuntimeError:  # the loop is closed already: nothing left to end
        pass
