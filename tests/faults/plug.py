"""A TCP relay between Writ and PostgreSQL whose plug a test can pull: the database goes away for real.

Pulling it resets every relayed connection and refuses new ones, which is what a replica sees when the
database host dies or the network between them breaks; plugging it back in accepts connections again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from sqlalchemy.engine import make_url

from tests.e2e.harness import free_port


class Plug:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host, self.port, self.target_port = host, free_port(), target_port
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()

    def plug_in(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            self._listener = socket.create_server((self.host, self.port))
            threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def pull(self) -> None:
        """Reset every relayed connection and refuse new ones until `plug_in`."""
        with self._lock:
            listener, self._listener = self._listener, None
            relayed, self._open = self._open, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            listener.close()
        for sock in relayed:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: close with a RST, as a dead peer's network would, not a polite FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                # A pump thread is blocked in recv on this socket, and the kernel closes a socket only
                # once no call is using it: without this, close() sends nothing and PostgreSQL keeps the
                # session (and any lock it holds) until its own timeouts end it.
                sock.shutdown(socket.SHUT_RD)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((self.host, self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # pulled meanwhile
                    client.close()
                    server.close()
                    return
                self._open.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def plugged(target_port: int) -> Iterator[Plug]:
    plug = Plug(target_port)
    plug.plug_in()
    try:
        yield plug
    finally:
        plug.pull()


def through(plug: Plug, url: str) -> str:
    """The store URL, with the database reached through the plug."""
    parsed = make_url(url)
    assert parsed.port in (None, plug.target_port)
    return parsed.set(host=plug.host, port=plug.port).render_as_string(hide_password=False)
