"""The kernel calls that put a process into an attempt's network island.

Kept free of anything heavy: the warm-start zygote (:mod:`tuner.backends.local.zygote_process`)
calls :func:`enter_as_owner` in every forked trial, and root's cold starts call
:func:`enter_as_root` between fork and exec.

Why two ways in: the island's network namespace is owned by a user namespace whose owner is the
attempt's person (:mod:`tuner.backends.local.island` says why). Root (a cold start, before it
drops to the person) may enter the network namespace directly. A warm trial is forked by a
zygote that already runs as the person, with no capability outside its own namespaces; the
kernel lets it join only namespaces owned by a user namespace it owns, so it joins that user
namespace first (gaining capabilities there, and only there), then the network namespace, and
then gives those capabilities up before any of the person's code runs.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def setns(fd: int, nstype: int) -> None:
    """Move the calling thread (this single-threaded process) into the namespace ``fd``."""
    _check(_libc().setns(fd, nstype), "setns")


def enter_as_root(net_fd: int) -> None:
    """Root, between fork and exec: join the island's network namespace (``net_fd``, opened
    by the parent). Dropping to the person afterwards clears every capability."""
    setns(net_fd, CLONE_NEWNET)


def enter_as_owner(ns_dir: str, net_inode: int) -> None:
    """The person's own process (a warm-started trial): join the island whose namespaces
    ``ns_dir`` (``/proc/<holder>/ns``) names, then hold no capability at all. The network
    namespace opened must be the island's (``net_inode``): a holder that died and whose pid
    went to another process is refused, never joined."""
    user = os.open(os.path.join(ns_dir, "user"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        net = os.open(os.path.join(ns_dir, "net"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(net).st_ino != net_inode:
                raise OSError(f"{ns_dir} is no longer the attempt's network island")
            setns(user, CLONE_NEWUSER)
            setns(net, CLONE_NEWNET)
        finally:
            os.close(net)
    finally:
        os.close(user)
    drop_capabilities()


def drop_capabilities() -> None:
    """Empty effective, permitted and inheritable capability sets (``capset``)."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc().capset(ctypes.byref(header), data), "capset")
