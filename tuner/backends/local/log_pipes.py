"""How a local attempt's output reaches its log: through pipes the tuner opened, never through a
file the trial could replace.

Each worker's stdout and stderr are the write end of a pipe the tuner made; the tuner reads the
other end on its event loop. Worker 0's output goes straight into the trial's log, a file the
tuner opened itself once per attempt (as :mod:`tuner.untrusted_files` says) in a directory where
the trial may create files but cannot remove or rename the tuner's
(:mod:`tuner.backends.local.ownership`). The other workers' output is kept in memory (its last
:data:`WORKER_LOG_BYTES`) and appended to the log under a header each when the attempt ends, the
shape the Kubernetes backend gives its per-pod logs. So there is no per-worker log file left
for a trial to swap for a FIFO or a link: whatever it puts in the trial's directory, the tuner
never opens it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tuner import untrusted_files

#: The end of each non-chief worker's output that is kept for the trial's log.
WORKER_LOG_BYTES = 1 << 20
#: The end of the chief's output kept in memory besides its log: what the attempt said last
#: is read from there when it fails, even when the log could not take it (a full disk).
CHIEF_TAIL_BYTES = 16 << 10
#: How long the output of an attempt whose processes have exited may still take to drain (a
#: process it left behind may hold the pipe open: its output is then no longer read).
DRAIN_SECONDS = 2.0


class _Reader(asyncio.Protocol):
    """Reads one pipe: chief output is written to the log, others' is kept (the end of it)."""

    def __init__(self, sink: int | None) -> None:
        self.sink = sink
        self.kept = bytearray()
        self.dropped = 0
        self.write_error: OSError | None = None  # the first write to the log that failed
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        limit = WORKER_LOG_BYTES
        if self.sink is not None:
            limit = CHIEF_TAIL_BYTES
            try:
                os.write(self.sink, data)
            except OSError as exc:  # a full disk must not stop the tuner: said in the reason
                self.write_error = self.write_error or exc
        self.kept += data
        if len(self.kept) > limit:
            extra = len(self.kept) - limit
            del self.kept[:extra]
            self.dropped += extra

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class AttemptLog:
    """The log of one attempt: the trial's log file, opened by the tuner, and one pipe per
    worker. Use :meth:`pipe` for each worker before starting it, :meth:`started` once it runs,
    :meth:`finish` when the attempt has ended."""

    def __init__(self, log_path: Path, header: str) -> None:
        """Open the log (``OSError`` if it is not a regular file) and begin it with
        ``header``."""
        self.fd = untrusted_files.open_regular(
            log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            self.write(header)
        except OSError:
            os.close(self.fd)
            raise
        self._readers: list[tuple[_Reader, asyncio.ReadTransport]] = []
        self._write_ends: list[int] = []

    def write(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def chief_tail(self) -> bytes:
        """The end of the chief's output (the last :data:`CHIEF_TAIL_BYTES`), as it came,
        whether or not the log could take it."""
        return bytes(self._readers[0][0].kept) if self._readers else b""

    def write_error(self) -> OSError | None:
        """The first error writing the chief's output to the log (``ENOSPC``: a full disk)."""
        return self._readers[0][0].write_error if self._readers else None

    async def pipe(self) -> int:
        """A new pipe for the next worker (the first is the chief); returns the write end the
        worker's stdout and stderr become. The tuner's copy is closed by :meth:`started`."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self._write_ends.append(write_end)
        reader = _Reader(self.fd if not self._readers else None)
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.connect_read_pipe(lambda: reader, os.fdopen(read_end, "rb"))
        except BaseException:
            os.close(read_end)
            raise
        self._readers.append((reader, transport))
        return write_end

    def started(self) -> None:
        """Close the tuner's copies of the write ends: the pipes end when the workers do."""
        for fd in self._write_ends:
            os.close(fd)
        self._write_ends.clear()

    async def finish(self) -> None:
        """Drain the pipes (at most :data:`DRAIN_SECONDS`), append the other workers' output
        under a header each, and close the log."""
        self.started()
        waiting = [reader.closed for reader, _ in self._readers]
        if waiting:
            await asyncio.wait(waiting, timeout=DRAIN_SECONDS)
        for _, transport in self._readers:
            transport.close()
        try:
            for index, (reader, _) in enumerate(self._readers[1:], start=1):
                text = reader.kept.decode(errors="replace")
                lost = f"[{reader.dropped} earlier bytes left out]\n" if reader.dropped else ""
                self.write(f"--- worker {index} ---\n{lost}{text}"
                           + ("" if not text or text.endswith("\n") else "\n"))
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Close everything without waiting (an attempt that could not start)."""
        self.started()
        for _, transport in self._readers:
            transport.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
