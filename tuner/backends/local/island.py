"""Every attempt is its own network island (one machine, as root with per-person Unix users).

Why: a process listening on the machine's loopback is reachable by every local user. A
``workers: 2`` trial's TensorFlow gRPC servers run whatever graph a client sends them, without
authentication, so another person's notebook could run code as the trial's owner; NCCL, a
debug server or anything a trial opens is the same class. Rather than check each protocol, an
attempt gets a network namespace of its own, shared by its workers and nobody else: what its
processes listen on (loopback included) exists only there.

How one is made (:meth:`Islands.open`):

- a *holder* process, running as the attempt's person, creates a user namespace (owned by that
  person, mapping only their own uid and gid) and a network namespace owned by it, and then
  waits. The user namespace is what lets warm-started workers (forked by a zygote that already
  runs as the person, :mod:`tuner.backends.local.netns`) join; it grants nothing outside the
  island: only the person's own ids are mapped. Cold starts join as root before dropping to
  the person. Another person's process can open the namespace files but the kernel refuses
  them ``setns`` (they hold no capability in a namespace they do not own).
- root brings ``lo`` up inside (``127.0.0.1`` and ``::1``: both exist only in the island) and,
  for egress, a veth pair: one end in the island, one on the host, a /30 of
  ``TUNEHUB_ISLAND_NETWORK`` between them, source NAT (nftables ``masquerade``) out of the
  machine's other interfaces. Where the machine has an IPv6 default route, the link also gets a
  /64 of ``TUNEHUB_ISLAND_NETWORK6`` and the island an IPv6 default route, masqueraded the same
  way (the machine's IPv6 forwarding is turned on, and its uplinks that take router
  advertisements keep taking them: ``accept_ra`` 2). Nothing may open a connection *into* an
  island over its link (another island, a process of the machine, the network), over IPv4 or
  IPv6: only answers to the island's own connections pass. Traffic from an island must come
  from an address routed back over its own link (reverse-path check: ``rp_filter`` for IPv4,
  an nftables ``fib`` rule for both), so an island cannot pretend to be another address.
- the report route comes in as a Unix socket in a directory only root and the person's private
  group can pass (``/run/tunehub-islands/<attempt>/report.sock``): the tuner accepts there and
  forwards each connection, byte for byte, to its own API address (TLS, if the API is HTTPS,
  stays end to end). The trial SDK connects to that socket when ``TUNEHUB_API_SOCKET`` is set.

When the attempt ends (:meth:`Island.close`) the forwarder stops, the directory goes, the
holder exits and the host's veth end is deleted; the namespace dies with the last of the
attempt's processes (they are killed when it ends).

Without egress (the setting off, or no ``nft`` on the machine) an island has only ``lo``: its
processes reach each other (over ``127.0.0.1`` or ``::1``), the data store (a filesystem) and
the tuner (the socket), nothing else over the network. Without an IPv6 default route on the
machine, its egress is IPv4 only (its ``eth0`` has a link-local IPv6 address, which nothing
outside may connect to).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from tunehub_base import unix_users
from tunehub_base.options import setting
from tunehub_base.parent_process import die_with_parent
from tunehub_base.system_tools import system_argv, system_tool

log = logging.getLogger("tunehub.local.island")

#: Root's directory of the islands' report sockets (passable, not listable, by others).
ISLAND_ROOT = Path("/run/tunehub-islands")
#: How many connections one attempt may hold open to the tuner through its report socket.
MAX_REPORT_CONNECTIONS = 16
HOST_IF_PREFIX = "thv"  # the host end of an island's veth pair: thv + 10 hex digits

ENV_ISLANDS = setting("TUNEHUB_NETWORK_ISLANDS")
ENV_EGRESS = setting("TUNEHUB_ISLAND_EGRESS")
ENV_NETWORK = setting("TUNEHUB_ISLAND_NETWORK")
ENV_NETWORK6 = setting("TUNEHUB_ISLAND_NETWORK6")

# Runs as the person (util-linux ``unshare``): new user + network namespaces, only its own uid and
# gid mapped (``setgroups`` denied), then says so and waits for its standard input to close (the
# island's end). Nothing of the person's environment or files runs in it.
HOLDER = ("unshare", "--user", "--net", "--map-user={uid}", "--map-group={gid}", "--",
          "/bin/sh", "-c", "echo ready; read _")

NFT_TABLE = "tunehub_islands"
#: How long the holder may take to make its namespaces before the attempt fails.
HOLDER_START_SECONDS = 30.0


def enabled() -> bool:
    """Islands are made when trials run as their owners (root, ``TUNEHUB_UNIX_USERS``) and
    ``TUNEHUB_NETWORK_ISLANDS`` is not ``0``: with one OS user there is nobody to keep out."""
    return ENV_ISLANDS.on()


@dataclass
class Island:
    """One attempt's network namespace, its veth pair and its report socket."""

    name: str
    holder: asyncio.subprocess.Process
    net_fd: int
    directory: Path
    host_if: str | None = None
    server: asyncio.AbstractServer | None = None
    _links: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def ns_dir(self) -> str:
        """Where the person's own processes find the namespaces. Should the person kill the
        holder and its pid be reused, a joining worker fails (it checks :attr:`net_inode`);
        root itself only ever uses :attr:`net_fd`."""
        return f"/proc/{self.holder.pid}/ns"

    @property
    def net_inode(self) -> int:
        """The network namespace's identity, as ``/proc/<pid>/ns/net`` shows it."""
        return os.fstat(self.net_fd).st_ino

    @property
    def report_socket(self) -> Path:
        return self.directory / "report.sock"

    async def close(self) -> None:
        """Stop forwarding, remove the socket's directory, end the holder, delete the veth."""
        if self.server is not None:
            self.server.close()
            for writer in list(self._links):
                writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.net_fd)
        if self.holder.returncode is None:
            if self.holder.stdin is not None:
                self.holder.stdin.close()
            try:
                await asyncio.wait_for(self.holder.wait(), 5)
            except asyncio.TimeoutError:
                self.holder.kill()
                await self.holder.wait()
        if self.host_if is not None:
            with contextlib.suppress(OSError):
                await _ip("link", "del", self.host_if)


class Islands:
    """Makes the islands of one backend's attempts."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.network = island_network(ENV_NETWORK.text())
        self.network6 = island_network6(ENV_NETWORK6.text())
        want_egress = ENV_EGRESS.on()
        self.egress = want_egress and system_tool("nft") is not None
        if want_egress and not self.egress:
            log.warning("no nft on this machine: attempts' islands have no egress "
                        "(make nftables installs it)")
        self.egress6 = self.egress and has_ipv6_default_route()
        remove_stale()

    def _name(self, trial_id: int, attempt: int) -> str:
        """Unique on the machine, also between tuners of different homes (tests run several)."""
        digest = hashlib.sha256(f"{self.home}:{trial_id}:{attempt}".encode()).hexdigest()
        return f"a{trial_id}-{attempt}-{digest[:10]}"

    async def open(self, trial_id: int, attempt: int, owner: unix_users.UnixUser,
                   api_url: str) -> Island:
        """The attempt's island, ready for its workers; ``OSError`` says why not."""
        name = self._name(trial_id, attempt)
        directory = _attempt_dir(name, owner.gid)
        try:
            holder = await asyncio.create_subprocess_exec(
                *(arg.format(uid=owner.uid, gid=owner.gid) for arg in HOLDER),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd="/", env={"PATH": os.defpath},
                preexec_fn=_as_person(owner),
            )
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        assert holder.stdout is not None and holder.stderr is not None
        try:  # it says so, or exits (its stdout closes)
            line = await asyncio.wait_for(holder.stdout.readline(), HOLDER_START_SECONDS)
        except asyncio.TimeoutError:
            line = b""
        if line != b"ready\n":
            if holder.returncode is None:
                holder.kill()
            await holder.wait()
            why = (await holder.stderr.read()).decode(errors="replace").strip()
            shutil.rmtree(directory, ignore_errors=True)
            raise OSError(f"cannot make a network namespace as {owner.login}: "
                          f"{why or 'the holder exited'}")
        net_fd = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        island = Island(name, holder, net_fd, directory)
        try:
            await self._plumb(island)
            island.server = await _forwarder(island, api_url)
        except BaseException:
            await island.close()
            raise
        return island

    async def _plumb(self, island: Island) -> None:
        """Through the namespace's descriptor, never the holder's pid: whatever happens to
        the holder (it is the person's process), root configures this namespace only."""
        netns = f"/proc/self/fd/{island.net_fd}"
        inside = ["link set lo up"]
        if self.egress:
            await self._ensure_egress()
            host_if = HOST_IF_PREFIX + island.name.rsplit("-", 1)[1]
            with contextlib.suppress(OSError):  # a leftover of a crashed tuner
                await _ip("link", "del", host_if)
            await _run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0",
                        "netns", netns], pass_fds=(island.net_fd,))
            island.host_if = host_if
            await _ip("link", "set", host_if, "up")
            subnet = await _claim(self.network, 30, island.name, host_if)
            host, inner = subnet[1], subnet[2]
            await _ip("addr", "add", f"{host}/32", "dev", host_if)
            Path(f"/proc/sys/net/ipv4/conf/{host_if}/rp_filter").write_text("1")
            inside += [f"addr add {inner}/{subnet.prefixlen} dev eth0", "link set eth0 up",
                       f"route add default via {host}"]
            if self.egress6:
                subnet6 = await _claim(self.network6, 64, island.name, host_if)
                host6, inner6 = subnet6[1], subnet6[2]
                await _ip("-6", "addr", "add", f"{host6}/128", "dev", host_if, "nodad")
                inside += [f"addr add {inner6}/64 dev eth0 nodad",
                           f"route add ::/0 via {host6} dev eth0"]
        await _run(["nsenter", f"--net={netns}", system_tool("ip") or "ip", "-batch", "-"],
                   "\n".join(inside) + "\n", pass_fds=(island.net_fd,))

    async def _ensure_egress(self) -> None:
        """Forwarding on, and the one nftables table of all islands: masquerade out of the
        machine; nothing starts a connection into an island (another island, the machine's
        processes, the network). Rewritten whole (one transaction) before every island, so it
        is never there twice, and a firewall reload that dropped it is undone by the next
        attempt at the latest."""
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        if self.egress6:
            _forward_ipv6()
        net = str(self.network)
        masquerade6 = (f'    ip6 saddr {self.network6} oifname != "{HOST_IF_PREFIX}*" masquerade\n'
                       if self.egress6 else "")
        rules = (
            f"table inet {NFT_TABLE} {{}}\n"
            f"delete table inet {NFT_TABLE}\n"
            f"table inet {NFT_TABLE} {{\n"
            # Into an island only what answers its own connections: not from another island,
            # not from the machine's own processes (over IPv4 or the link's IPv6), not from
            # the network.
            "  chain forward { type filter hook forward priority filter; policy accept;\n"
            f'    oifname "{HOST_IF_PREFIX}*" ct state != {{ established, related }} drop\n'
            "  }\n"
            # The machine's own neighbour discovery on the link (IPv6's ARP, which conntrack
            # does not track) passes: without it the island cannot resolve its gateway.
            "  chain output { type filter hook output priority filter; policy accept;\n"
            f'    oifname "{HOST_IF_PREFIX}*" icmpv6 type '
            "{ nd-neighbor-solicit, nd-neighbor-advert } accept\n"
            f'    oifname "{HOST_IF_PREFIX}*" ct state != {{ established, related }} drop\n'
            "  }\n"
            # Out of an island only from an address routed back over its own link (IPv6 has no
            # rp_filter; this is its nftables form, for both families).
            "  chain prerouting { type filter hook prerouting priority raw; policy accept;\n"
            f'    iifname "{HOST_IF_PREFIX}*" fib saddr . iif oif missing drop\n'
            "  }\n"
            "  chain postrouting { type nat hook postrouting priority srcnat; policy accept;\n"
            f'    ip saddr {net} oifname != "{HOST_IF_PREFIX}*" masquerade\n'
            f"{masquerade6}"
            "  }\n"
            "}\n"
        )
        await _run(["nft", "-f", "-"], rules)


async def _claim(network: ipaddress.IPv4Network | ipaddress.IPv6Network, prefixlen: int,
                 name: str, host_if: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A ``/prefixlen`` of ``network`` no other island holds: the route to it over ``host_if``
    is the claim (the kernel refuses a second identical route), starting where the island's
    name hashes to."""
    subnets = 1 << (prefixlen - network.prefixlen)
    size = 1 << (network.max_prefixlen - prefixlen)
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % subnets
    base = int(network.network_address)
    for step in range(64):
        subnet = ipaddress.ip_network((base + ((start + step) % subnets) * size, prefixlen))
        try:
            await _ip(f"-{subnet.version}", "route", "add", str(subnet), "dev", host_if)
            return subnet
        except OSError as exc:
            if "File exists" not in str(exc):
                raise
    raise OSError(f"no free /{prefixlen} in {network} for the island's link")


def island_network(text: str) -> ipaddress.IPv4Network:
    """``TUNEHUB_ISLAND_NETWORK`` read: an IPv4 network with room for at least one /30."""
    network = _network(ENV_NETWORK.env, text, 4, 30, "100.64.0.0/10")
    assert isinstance(network, ipaddress.IPv4Network)
    return network


def island_network6(text: str) -> ipaddress.IPv6Network:
    """``TUNEHUB_ISLAND_NETWORK6`` read: an IPv6 network with room for at least one /64."""
    network = _network(ENV_NETWORK6.env, text, 6, 64, "fd74:6e68:7562::/48")
    assert isinstance(network, ipaddress.IPv6Network)
    return network


def _network(env: str, text: str, version: int, per_island: int, example: str,
             ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """``text`` as an IPv``version`` network with room for a ``/per_island``; a ValueError
    naming the setting ``env`` otherwise."""
    try:
        network = ipaddress.ip_network(text)
        if network.version != version:
            raise ValueError(f"not an IPv{version} network")
    except ValueError as exc:
        raise ValueError(f"{env}: expected an IPv{version} network such as {example}, got "
                         f"{text!r} ({exc})") from None
    if network.prefixlen > per_island:
        raise ValueError(f"{env}: {text} has no room for a /{per_island} per island")
    return network


def has_ipv6_default_route() -> bool:
    """Whether the machine routes IPv6 anywhere (``/proc/net/ipv6_route`` has a ``::/0``
    route through a device other than ``lo``): only then do islands get IPv6 egress."""
    try:
        lines = Path("/proc/net/ipv6_route").read_text().splitlines()
    except OSError:  # no IPv6 in this kernel
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 10 and fields[0] == "0" * 32 and fields[1] == "00" \
                and fields[9] != "lo":
            return True
    return False


def _forward_ipv6() -> None:
    """IPv6 forwarding on. With it on, the kernel ignores router advertisements on interfaces
    whose ``accept_ra`` is 1, and a machine that learnt its IPv6 route from them would lose
    it when that expires: those interfaces are set to 2 (take them even when forwarding)."""
    conf = Path("/proc/sys/net/ipv6/conf")
    for interface in os.listdir(conf):
        if interface in ("all", "default", "lo") or interface.startswith(HOST_IF_PREFIX):
            continue
        accept_ra = conf / interface / "accept_ra"
        with contextlib.suppress(OSError):
            if accept_ra.read_text().strip() == "1":
                accept_ra.write_text("2")
                log.info("IPv6 forwarding for the islands: %s keeps taking router "
                         "advertisements (accept_ra 2)", interface)
    (conf / "all" / "forwarding").write_text("1")


def _as_person(owner: unix_users.UnixUser) -> Callable[[], None]:
    drop = unix_users.privilege_dropper(owner)

    def preexec() -> None:
        drop()
        die_with_parent(signal.SIGKILL)  # a killed tuner leaves no holder (no namespace) behind

    return preexec


def remove_stale(min_age: float = 60.0) -> None:
    """Remove the socket directories of islands whose tuner died without closing them (their
    namespaces died with their holders): nobody listens on their socket any more. Only
    directories older than ``min_age`` seconds, so one another tuner is making is left alone."""
    try:
        names = os.listdir(ISLAND_ROOT)
    except OSError:
        return
    for name in names:
        path = ISLAND_ROOT / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or time.time() - st.st_mtime < min_age:
            continue
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path / "report.sock"))
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            probe.close()


def _attempt_dir(name: str, gid: int) -> Path:
    """``/run/tunehub-islands/<name>``: root's, passable by the person's private group only.
    Made fresh; the parent is root's and never writable by anyone else, so no path here is
    anybody's but root's."""
    root_fd = _root_dir()
    os.close(root_fd)
    directory = ISLAND_ROOT / name
    shutil.rmtree(directory, ignore_errors=True)
    os.mkdir(directory, 0o750)
    os.chown(directory, 0, gid)
    os.chmod(directory, 0o750)
    return directory


def _root_dir() -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(ISLAND_ROOT, 0o711)
    fd = os.open(ISLAND_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o022:
        os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o711)
    return fd


async def _forwarder(island: Island, api_url: str) -> asyncio.AbstractServer:
    """The report socket: each connection is piped to the tuner's own API address."""
    url = urlparse(api_url)
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if url.scheme == "https" else 80)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(island._links) >= 2 * MAX_REPORT_CONNECTIONS:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        island._links.update((writer, up_writer))
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            island._links.difference_update((writer, up_writer))

    server = await asyncio.start_unix_server(accept, path=str(island.report_socket))
    os.chmod(island.report_socket, 0o660)
    os.chown(island.report_socket, 0, island.directory.stat().st_gid)
    return server


async def _ip(*args: str) -> None:
    await _run(["ip", *args])


async def _run(argv: list[str], stdin: str | None = None, pass_fds: tuple[int, ...] = ()) -> None:
    """Run a root tool to completion; ``OSError`` with what it said when it fails."""
    proc = await asyncio.create_subprocess_exec(
        *system_argv(argv),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, pass_fds=pass_fds)
    _, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(argv[:3])}: {err.decode(errors='replace').strip()}")
