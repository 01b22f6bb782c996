"""A TCP proxy on 127.0.0.1 that can cut every connection and refuse new ones for a while:
what a restarted database or a network cut looks like to the client.

A cut must reach both peers of every connection: each socket is shut down (which sends the
FIN and wakes the thread reading it) before any is closed. Closing alone is not enough: on
Linux a socket closed while another thread is blocked reading it stays open, and its peer then
waits forever on a connection that looks alive (an earlier version did that, and the client
waited for an answer that could never come, in about 1 run of 8).

``freeze()`` is the other kind of failure: the connections stay open but nothing passes through
them any more, as when a server or a middlebox hangs without closing anything; a client only
gets out of one with a deadline of its own.
"""

from __future__ import annotations

import contextlib
import socket
import threading


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class CuttableProxy:
    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._frozen: set[socket.socket] = set()  # connections that pass nothing any more
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Close every connection now; new ones are closed as soon as they arrive."""
        with self._lock:
            self._cut = True
            sockets = list(self._open)
        for sock in sockets:  # the pipe threads, woken by this, close them
            _shut(sock)

    def freeze(self) -> None:
        """Stop passing data on every open connection, closing none (and never again: a hung
        connection stays hung); connections made later work."""
        with self._lock:
            self._frozen |= self._open

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:  # checked under the lock: a cut either sees this pair or refuses it
                if not self._cut:
                    self._open |= {client, upstream}
                    client_ok = True
                else:
                    self.refused += 1
                    client_ok = False
            if not client_ok:
                client.close()
                upstream.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    frozen = source in self._frozen
                if not frozen:
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            # Shut both down first: the other direction's thread wakes up and the peers see
            # the end; then each thread closes its own source (so none is closed under a read).
            _shut(source)
            _shut(sink)
            source.close()
            with self._lock:
                self._open.discard(source)
                self._frozen.discard(source)
