"""The pool's reading of hub group membership (tuner.scheduling.hub_groups) against a real HTTP
server answering as the hub's ``GET /hub/api/groups/<name>``: a missing group counts nobody,
a hub that fails leaves the last membership in force, and only the named groups are read."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tuner.scheduling.hub_groups import HubGroups


@pytest.fixture
def groups_api() -> Iterator[tuple[str, dict[str, object], list[str]]]:
    """A server answering as the hub's groups API does (one group, and the paged list);
    yields its API URL, the groups (edit them to change its answers) and the paths asked."""
    groups: dict[str, object] = {"vision": ["bob", "carl"], "nlp": ["ana"]}
    asked: list[str] = []

    class Groups(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            assert self.headers["Authorization"] == "token service-token"
            if groups.get("broken"):
                self.send_error(500)
                return
            url = urlsplit(self.path)
            if url.path.endswith("/groups"):  # the list, a page at a time, as the hub pages it
                query = parse_qs(url.query)
                offset, limit = int(query["offset"][0]), int(query["limit"][0])
                names = sorted(groups)[offset:offset + limit]
                listed = [{"kind": "group", "name": n, "users": groups[n]} for n in names]
                body = json.dumps(listed).encode()
            else:
                name = url.path.rsplit("/", 1)[1]
                if name not in groups:
                    self.send_error(404)
                    return
                body = json.dumps({"kind": "group", "name": name, "users": groups[name]}
                                  ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Groups)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hub/api/", groups, asked
    finally:
        server.shutdown()


async def test_members_of_the_named_groups_only(
        groups_api: tuple[str, dict[str, object], list[str]]) -> None:
    url, groups, asked = groups_api
    reader = HubGroups(url, "service-token")
    assert reader.of("bob") == () and reader.members("vision") is None  # not read yet
    await reader.refresh(["vision", "robotics"])
    assert sorted(asked) == ["/hub/api/groups/robotics", "/hub/api/groups/vision"]
    assert reader.of("bob") == ("vision",) and reader.of("ana") == ()  # nlp is not configured
    assert reader.members("vision") == ["bob", "carl"]
    assert reader.members("robotics") == []  # the hub has no such group: nobody counts

    groups["broken"] = True  # the hub fails: what was read stays in force
    await reader.refresh(["vision", "robotics"])
    assert reader.of("bob") == ("vision",)
    del groups["broken"]
    groups["vision"] = ["carl"]  # bob left the team
    await reader.refresh(["vision"])
    assert reader.of("bob") == () and reader.of("carl") == ("vision",)
    assert reader.members("robotics") is None  # no longer configured: forgotten


async def test_every_group_a_page_at_a_time(
        groups_api: tuple[str, dict[str, object], list[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kubernetes reads every group (GPU-hours per group): all pages of the hub's list."""
    import tuner.scheduling.hub_groups as hub_groups

    url, groups, asked = groups_api
    groups.update({f"team-{i}": [f"p{i}"] for i in range(5)})
    monkeypatch.setattr(hub_groups, "PAGE", 2)  # 7 groups: pages of 2, 2, 2, 1
    reader = HubGroups(url, "service-token")
    await reader.refresh(None)
    assert [p.split("?")[1] for p in asked] == [
        "offset=0&limit=2", "offset=2&limit=2", "offset=4&limit=2", "offset=6&limit=2"]
    assert reader.of("ana") == ("nlp",) and reader.of("bob") == ("vision",)
    assert reader.of("p4") == ("team-4",) and reader.members("team-0") == ["p0"]
