"""Root runs the machine's own administration tools, whatever ``PATH`` it was given: found in the
system directories when ``PATH`` lacks them (``env -i``, a service manager's ``PATH``), and never
a same-named program from a directory someone else can write, even one early in ``PATH``.
(Found by hand: ``tunehub up`` with ``PATH=/usr/bin:/bin`` ended in a traceback, its
``groupadd`` in ``/usr/sbin`` not found.)"""

from __future__ import annotations

import grp
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tunehub_base.system_tools import system_argv, system_tool
from tunehub_base.unix_users import UnixUsers


def test_tools_are_found_where_path_lacks_them(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("useradd", "groupadd", "nft", "ip", "setfacl"):
        found = system_tool(name)
        assert found is not None and Path(found).parent in (
            Path("/usr/sbin"), Path("/usr/bin"), Path("/sbin"), Path("/bin")), (name, found)
    assert system_argv(["nft", "-f", "-"])[1:] == ["-f", "-"]


def test_a_program_planted_early_in_path_is_not_what_root_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    planted = tmp_path / "nft"
    planted.write_text("#!/bin/sh\necho planted\n")
    planted.chmod(0o777)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert system_tool("nft") == "/usr/sbin/nft"
    # A program the system does not have is still looked for in PATH.
    (tmp_path / "tunehub-own-tool").write_text("#!/bin/sh\n")
    (tmp_path / "tunehub-own-tool").chmod(0o755)
    assert system_tool("tunehub-own-tool") == str(tmp_path / "tunehub-own-tool")


def test_the_shared_group_is_made_with_a_path_lacking_sbin(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the suite runs as root (it makes system users)"
    group = f"tht{secrets.token_hex(4)}"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    try:
        gid = UnixUsers(tmp_path, group=group).group_id()
        assert grp.getgrnam(group).gr_gid == gid
    finally:
        subprocess.run(["/usr/sbin/groupdel", group], capture_output=True, check=False)
