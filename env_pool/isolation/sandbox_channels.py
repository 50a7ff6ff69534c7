"""The pipes of one sandboxed run, parent side: the payload in, the output and the result out.

Everything that comes out is the run's and untrusted: it is read concurrently (so a child that
writes without end cannot block the parent) and kept bounded (``HeadTail`` for stdout+stderr,
``BoundedBytes`` for the result channel); whoever reads the result must validate it. The
payload goes in from a thread, so a child that never reads cannot block the parent either.
"""
from __future__ import annotations

import os
from typing import Callable


def feed(fd: int, payload: bytes) -> None:
    """Write the payload to the child's stdin; a child that never reads only costs EPIPE."""
    try:
        view = memoryview(payload)
        while view:
            n = os.write(fd, view[: 1 << 20])
            view = view[n:]
    except OSError:
        pass
    finally:
        os.close(fd)


def drain(fd: int, sink: Callable[[bytes], None]) -> None:
    """Read ``fd`` to its end into ``sink``, then close it."""
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            sink(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)


class HeadTail:
    """Bounded output: the first and last limit/2 bytes, and how many were cut in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            if len(chunk) >= self.tail_limit:
                self.tail[:] = chunk[len(chunk) - self.tail_limit:]
            else:
                self.tail += chunk
                excess = len(self.tail) - self.tail_limit
                if excess > 0:
                    del self.tail[:excess]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if cut > 0:
            return f"{head}\n[... {cut} bytes of output cut ...]\n{tail}"
        return head + tail


class BoundedBytes:
    """At most ``limit`` bytes; past it, nothing is kept (``overflow``) but reading goes on."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.overflow = True
            self.chunks.clear()  # keep draining so the writer is never blocked; store nothing
        elif not self.overflow:
            self.chunks.append(chunk)

    def value(self) -> bytes | None:
        if self.overflow or self.size == 0:
            return None
        return b"".join(self.chunks)
