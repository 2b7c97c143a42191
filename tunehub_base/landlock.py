"""Abstract Unix sockets fenced with Landlock's scopes (Linux 6.12+, Landlock ABI 6).

An abstract Unix socket (a name starting with a NUL byte) has no file and so no permission:
within one network namespace, any process can connect to any of them. The TCP/UDP fence of
people's notebooks (:mod:`hub.network_fence`) cannot see them. Landlock can: a process that
restricts itself with ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`` (and everything it starts, for
good) can connect only to abstract sockets made inside its own Landlock domain. So each notebook
server, before it runs anything of the person's, enters a domain of its own: its kernels and
what they start reach each other's abstract sockets; another person's notebook is refused
(``EPERM``). Processes in no domain (root's: the hub, the tuner) are not restricted.

Only the scope is handled: no file or network access is restricted by the domain.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable

#: The same numbers on every architecture (the generic syscall table).
_CREATE_RULESET, _RESTRICT_SELF = 444, 446
_CREATE_RULESET_VERSION = 1
#: Since ABI 6.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPES_SINCE_ABI = 6


def _syscall() -> Callable[..., int]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or off."""
    try:
        version = _syscall()(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def abstract_socket_scoper() -> Callable[[], None] | None:
    """A function that puts its caller in a new Landlock domain whose abstract Unix sockets are
    its own, to be called between fork and exec (as root, or after ``no_new_privs``); ``None``
    where the kernel cannot (Landlock off, or an ABI before 6). Everything that can fail or
    allocate is done here, in the parent."""
    if abi() < SCOPES_SINCE_ABI:
        return None
    syscall = _syscall()
    # struct landlock_ruleset_attr {handled_access_fs, handled_access_net, scoped}: u64 each.
    packed = struct.pack("=QQQ", 0, 0, SCOPE_ABSTRACT_UNIX_SOCKET)
    attr, size = ctypes.create_string_buffer(packed, len(packed)), len(packed)

    def scope() -> None:
        ruleset = syscall(_CREATE_RULESET, attr, size, 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        try:
            if syscall(_RESTRICT_SELF, ruleset, 0) < 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        finally:
            os.close(ruleset)

    return scope
