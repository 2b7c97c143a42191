"""What a warm trial preloads, worked out in a child process, never on the tuner's event loop.

Why a process and not a thread: the work is parsing a person's files (their modules' syntax
trees, a notebook function's pickle), and a parse holds the interpreter lock for as long as it
takes: a 2 MiB helper module kept the loop, and so every person's API call and every trial's
report, waiting 5 s; 8 MiB, 32 s and 4 GB of memory. In a child the loop only waits on a pipe,
the child's memory and CPU are capped (:data:`MEMORY_BYTES`, :data:`CPU_SECONDS`), and after
:data:`TIMEOUT_SECONDS` it is killed and the trial starts with nothing heavy preloaded (it
imports what it needs itself, as a cold start would).

``python -m tuner.backends.local.preload_child`` reads its question as JSON on stdin and answers
the module names as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MEMORY_BYTES = 2 * 2**30
CPU_SECONDS = 60
TIMEOUT_SECONDS = 60.0


def _limit() -> None:
    """Run in the child before it starts: its own memory and CPU bounds."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


async def preload_in_child(
    workdir: Path, argv: list[str], requested: str | tuple[str, ...], owner_uid: int | None,
    fallback: tuple[str, ...],
) -> tuple[str, ...]:
    """:func:`tuner.backends.local.warm.preload_for`, answered by a bounded child process;
    ``fallback`` when the child fails or runs out of time."""
    question = json.dumps({"workdir": str(workdir), "argv": argv, "owner_uid": owner_uid,
                           "requested": requested if isinstance(requested, str)
                           else list(requested)}).encode()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=_limit,
        )
    except OSError as exc:  # out of processes or descriptors: start without preloading
        log.warning("preload of %s: cannot start a child: %s", workdir, exc)
        return fallback
    try:
        out, err = await asyncio.wait_for(proc.communicate(question), TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        log.warning("preload of %s: no answer in %ss; nothing heavy preloaded", workdir,
                    TIMEOUT_SECONDS)
        return fallback
    if proc.returncode != 0:
        log.warning("preload of %s failed (%s): %s", workdir, proc.returncode,
                    err.decode(errors="replace")[-500:])
        return fallback
    try:
        return tuple(str(m) for m in json.loads(out))
    except (ValueError, TypeError):
        return fallback


def main() -> None:
    from tuner.backends.local.warm import preload_for

    question = json.loads(sys.stdin.buffer.read())
    requested = question["requested"]
    found = preload_for(Path(question["workdir"]), list(question["argv"]),
                        requested if isinstance(requested, str) else tuple(requested),
                        question["owner_uid"])
    sys.stdout.write(json.dumps(list(found)))


if __name__ == "__main__":
    main()
