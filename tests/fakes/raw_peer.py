"""A loopback HTTP peer on a bare socket that sends its body as slowly (or as endlessly) as told."""

from __future__ import annotations

import socket
import threading
import time


class RawPeer:
    """A loopback HTTP peer written on a bare socket: no Content-Length, no chunking, and paced as told.

    endless: sends body bytes until the client hangs up; stall: a few bytes, then silence; dribble: one byte
    every 0.1 s (a per-read timeout never fires)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.sent: dict[str, int] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = conn.recv(65536).decode("latin-1")
            mode = request.split(" ", 2)[1].strip("/")
            self.sent[mode] = 0
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
                until = time.monotonic() + 10
                while time.monotonic() < until and not self.stop.is_set():
                    if mode == "endless":
                        conn.sendall(b"x" * 65536)
                        self.sent[mode] += 65536
                    elif mode == "stall":
                        if not self.sent[mode]:
                            conn.sendall(b"xxxx")
                            self.sent[mode] = 4
                        time.sleep(0.05)
                    else:  # dribble
                        conn.sendall(b"x")
                        self.sent[mode] += 1
                        time.sleep(0.1)
            except OSError:  # the client hung up
                pass
