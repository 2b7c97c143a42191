"""Warm trial starts: a process that imports TensorFlow once and forks each trial from itself.

A new Python process importing TensorFlow costs seconds; a fork of one that already did costs
milliseconds. Every trial still gets a process of its own (a fresh Keras session, its own
memory), so a trial that crashes or leaks cannot affect the next one: it is only the imports that
are shared, copy-on-write.

Protocol: JSON lines over a socket pair with the backend. ``{"op": "spawn", "id", "argv",
"cwd", "env", "island"}`` in, each preceded by one descriptor on a second socket pair
(``SCM_RIGHTS``): the write end of the pipe the trial's stdout and stderr become, opened by the
tuner; ``{"op": "spawned", "id", "pid"}``, ``{"op": "exited", "id", "code"}``
and ``{"op": "error", "id", "error"}`` out. ``code`` is negative for a signal, like asyncio's.
A spawned child waits, before anything else, until ``{"op": "go", "id"}`` comes in: meanwhile
the backend (root) places it in its attempt's cgroup (:mod:`tuner.backends.local.cgroups`), so
not one line of the trial's code runs outside it; ``{"op": "abort", "id"}`` makes it exit.

Only installed packages are preloaded, with ``sys.path`` cut to the standard library's and the
installed packages' directories meanwhile (:mod:`tuner.backends.local.installed`): nothing of the
person's runs here, outside their trials' cgroups. What a trial imports after its fork anyway (a
module named at run time, one the import graph could not see) is timed
(:mod:`tuner.backends.local.import_clock`); the installed packages it spent time on are named
in its log and sent back with its exit (``"imported": {"sklearn": 0.91}``, seconds, in
``exited``), so the sweep says it was not fully warm and why.

Run as ``python -m tuner.backends.local.zygote_process FD FD_CHANNEL MODULE[,MODULE...]``.
"""

from __future__ import annotations

import importlib
import json
import os

# runpy.run_path imports pkgutil on each call: imported here, once, it is not loaded again
# inside every forked trial (a millisecond of every trial's life).
import pkgutil  # noqa: F401
import random
import runpy
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

from tunehub_base.parent_process import die_with_parent
from tuner.backends.local import installed
from tuner.backends.local.import_clock import ImportClock
from tuner.backends.local.netns import enter_as_owner
from tuner.scheduling.workdirs import HEADER

#: Imported by the trial SDK itself (:mod:`tuner.sdk.training`: reports from a network island
#: go over a Unix socket with httpx): preloaded for every trial, so the platform's own imports
#: never make a trial not fully warm.
PLATFORM_PRELOAD = ("httpx",)


#: A trial's report of what it imported after its fork names at most this many packages: it
#: is written in one piece to a pipe (atomic, and never blocking, under ``PIPE_BUF``).
MAX_REPORTED = 20


def _report_imports(clock: ImportClock | None, report: int) -> None:
    """At a trial's exit: the installed packages it spent time importing itself, on its
    stderr (its log) and to the zygote through ``report``."""
    if clock is None:
        return
    try:
        late = dict(list(clock.late().items())[:MAX_REPORTED])
    except Exception:  # e.g. its threads still importing: say nothing rather than fail its exit
        return
    try:
        if late:
            names = ", ".join(f"{name} ({spent:.2f} s)" for name, spent in late.items())
            print(f"{HEADER} not fully warm: this trial spent {sum(late.values()):.2f} s "
                  f"importing {names} after its warm start (the import graph of its code did "
                  "not name them; the spec's preload: can) ===", file=sys.stderr)
    except (OSError, ValueError, AttributeError):  # the trial closed or replaced its stderr
        pass
    try:
        os.write(report, json.dumps(late).encode()[:4000])
    except OSError:
        pass


def _run_child(request: dict[str, Any], sock: socket.socket, gate: int, report: int) -> None:
    """In the forked child: wait at ``gate`` for the backend's go, then become the trial;
    at its end, say what it imported itself on ``report``. Never returns."""
    code = 1
    clock: ImportClock | None = None
    try:
        sock.close()
        if os.read(gate, 1) != b"1":  # aborted, or the zygote died: never run the trial
            os._exit(1)
        os.close(gate)
        os.setsid()
        die_with_parent(signal.SIGKILL)
        fd = request["output"]
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        if request.get("island"):  # its attempt's network island, before any of its code
            enter_as_owner(*request["island"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # A fork copies the random state: reseed so trials do not share "random" numbers.
        random.seed()
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(int.from_bytes(os.urandom(4), "little"))
        args = request["argv"]
        sys.path.insert(0, request["cwd"])
        clock = ImportClock()
        if not clock.start():
            clock = None
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            _send_held_reports()
            _report_imports(clock, report)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send_held_reports() -> None:
    """What the trial's SDK still holds (:func:`tuner.sdk.training.send_held_reports`), sent
    before the child leaves with ``os._exit``, which runs no ``atexit`` handler (a cold-started
    trial's interpreter sends it from one)."""
    training = sys.modules.get("tuner.sdk.training")
    if training is None:
        return
    try:
        training.send_held_reports()
    except Exception:
        traceback.print_exc()  # into the trial's log: its last values did not reach the tuner


def _preload(modules: list[str]) -> None:
    """Import ``modules`` with file descriptor 2 silenced: TensorFlow's import chatter (oneDNN,
    absl) would otherwise land on the terminal of whoever runs the sweep. Only installed
    packages and tunehub's own, from the trusted part of ``sys.path`` (restored afterwards, so
    the trials see all of it). A module that fails to import is skipped; the trial that needs
    it reports the error in its own log."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stderr.flush()
    os.dup2(devnull, 2)
    path = list(sys.path)
    tuner = sys.modules["tuner"]  # imported with this module: where tunehub's code comes from
    platform_root = os.path.dirname(os.path.dirname(os.path.abspath(str(tuner.__file__))))
    sys.path[:] = installed.trusted_path(path, platform_root)
    try:
        for module in [*PLATFORM_PRELOAD, *modules]:
            if module.split(".")[0] not in installed.PLATFORM and not installed.is_installed(
                    module):
                continue
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    finally:
        sys.path[:] = path
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _read_report(fd: int | None) -> Any:
    """What a trial that exited wrote on its report pipe (JSON, or None: it was killed, or
    wrote nothing); never waits: a process it forked may still hold the pipe's other end."""
    if fd is None:
        return None
    try:
        return json.loads(os.read(fd, 4096) or b"null")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def serve(fd: int, fd_channel: int, preload: list[str]) -> None:
    die_with_parent(signal.SIGKILL)
    _preload(preload)
    sock = socket.socket(fileno=fd)
    channel = socket.socket(fileno=fd_channel)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "sock")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, str] = {}
    gates: dict[str, int] = {}  # spawned children waiting for their go, by id
    reports: dict[int, int] = {}  # by pid: where each child says what it imported itself
    buffer = b""

    def send(message: dict[str, Any]) -> None:
        sock.sendall(json.dumps(message).encode() + b"\n")

    send({"op": "ready", "pid": os.getpid()})
    while True:
        for key, _ in sel.select():
            if key.data == "wake":
                os.read(wake_r, 4096)
            else:
                chunk = sock.recv(65536)
                if not chunk:
                    return  # the backend went away; our children die with us
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    request = json.loads(line)
                    if request.get("op") in ("go", "abort"):
                        gate = gates.pop(request["id"], None)
                        if gate is not None:
                            try:
                                if request["op"] == "go":
                                    os.write(gate, b"1")
                            except BrokenPipeError:
                                pass  # it died before its go: waitpid reports that below
                            finally:
                                os.close(gate)
                        continue
                    _, fds, _, _ = socket.recv_fds(channel, 1, 1)
                    request["output"] = fds[0]
                    wait, gate = os.pipe()
                    told, tell = os.pipe()  # what the trial imported itself, at its end
                    try:
                        pid = os.fork()
                    except OSError as exc:
                        for fd in (wait, gate, told, tell, fds[0]):
                            os.close(fd)
                        send({"op": "error", "id": request["id"], "error": str(exc)})
                        continue
                    if pid == 0:
                        os.close(gate)
                        os.close(told)
                        for other in (*gates.values(), *reports.values()):
                            os.close(other)
                        channel.close()
                        _run_child(request, sock, wait, tell)
                    os.close(wait)
                    os.close(tell)
                    os.close(fds[0])  # only the trial holds its pipe: it ends when they do
                    os.set_blocking(told, False)
                    gates[request["id"]] = gate
                    reports[pid] = told
                    children[pid] = request["id"]
                    send({"op": "spawned", "id": request["id"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            send({"op": "exited", "id": children.pop(pid, ""), "pid": pid, "code": code,
                  "imported": _read_report(reports.pop(pid, None))})


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]),
          [m for m in sys.argv[3].split(",") if m] if len(sys.argv) > 3 else [])
