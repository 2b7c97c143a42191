"""The hub journey in a real browser (Debian chromium driven by Playwright): ``tunehub up``,
log in, start a server, open JupyterLab, run a cell that submits the digits sweep and watches
it finish, see the promoted model on the sweeps page; a second user can neither see nor cancel
that sweep."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import readme
from tests.hub_fixtures import REPO, Platform
from tests.polling import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
#: Run after the README's cell, in the same kernel: what the test reads back.
CHECK_CELL = """\
print("SWEEP-DONE", sweep.id, sweep.state, sweep.best["number"], len(sweep.trials()))
"""
NEWS_PROMPT = "official Jupyter news"
#: JupyterLab's dialog when a request to its server failed: on a busy machine one can time out.
#: JupyterLab goes on reconnecting by itself, and a person dismisses the dialog.
CONNECTION_LOST = "Server Connection Error"


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise AssertionError(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def sweeps_page(hub_url: str, user: str) -> Iterator[Any]:
    """A Chromium page on the tuner's Sweeps page, signed in as ``user`` through the hub's login
    (test hubs take any password) and sent back by OAuth; the browser closes after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = b.new_page()
            page.goto(f"{hub_url}services/tuner/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", "any")
            page.click("#login_submit")
            yield page
        finally:
            b.close()


def login(page: Any, url: str, username: str, password: str) -> None:
    page.goto(f"{url}hub/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/(hub/home|hub/spawn.*|user/.*)$"), timeout=60_000)


def answer_lab_dialogs(page: Any) -> None:
    """Before each action on ``page``: close JupyterLab's connection-lost dialog as a person
    would (it covers the page and takes the click otherwise). Any other dialog is left to fail
    the action."""
    lost = page.locator(".jp-Dialog", has_text=CONNECTION_LOST)
    page.add_locator_handler(
        lost, lambda dialog: dialog.get_by_role("button", name="Close", exact=True).first.click())


def hub_api(page: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A hub API call from the logged-in page (cookie + the hub's XSRF token)."""
    return tuple(page.evaluate(
        """async ([method, path, body]) => {
            const xsrf = (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "";
            const r = await fetch(path, {method, headers: {"X-XSRFToken": decodeURIComponent(xsrf),
                "Content-Type": "application/json"}, body: body ? JSON.stringify(body) : null});
            return [r.status, await r.text()];
        }""",
        [method, path, body],
    ))


def test_the_readme_quick_start_as_written(
    readme_platform: Platform, browser: Any, tmp_path: Path
) -> None:
    """The README followed word for word on a fresh home with no ``TUNEHUB_*`` variable: its
    ``make up``, its notebook cell typed into JupyterLab, the Sweeps page."""
    platform = readme_platform
    platform.start()
    assert platform.password, platform.output
    page = browser.new_page()
    page.set_default_timeout(120_000)
    answer_lab_dialogs(page)
    login(page, platform.url, "admin", platform.password)

    # The home page links to the sweeps page; start the server.
    page.goto(f"{platform.url}hub/home")
    assert page.locator("#tunehub-sweeps").get_attribute("href") == "/services/tuner/"
    page.click("#start")
    page.wait_for_url(re.compile(r".*/user/admin/lab.*"), timeout=180_000)
    # Run the cell only once JupyterLab is connected to the new kernel (its kernel_info_reply
    # has arrived): a run asked of a kernel still connecting is dropped by JupyterLab.
    with page.expect_websocket(lambda ws: "/channels" in ws.url, timeout=180_000) as kernel_ws:
        page.locator(".jp-LauncherCard[title*='Python 3']").first.click()
    kernel_ws.value.wait_for_event(
        "framereceived", predicate=lambda frame: "kernel_info_reply" in str(frame),
        timeout=180_000,
    )
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click()
    page.keyboard.insert_text(readme.notebook_cell())
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-Notebook .jp-Cell .cm-content").nth(1).click()
    page.keyboard.insert_text(CHECK_CELL)
    page.keyboard.press("Shift+Enter")
    outputs = page.locator(".jp-OutputArea-output")
    outputs.filter(has_text=re.compile(r"SWEEP-DONE \d|Error")).first.wait_for(timeout=600_000)
    text = "\n".join(outputs.all_inner_texts())
    assert re.search(r"SWEEP-DONE \d", text), text[-3000:]
    fields = text.split("SWEEP-DONE ", 1)[1].split()
    sweep_id, state, best, n_trials = int(fields[0]), fields[1], int(fields[2]), int(fields[3])
    trials = int(re.search(r"trials=(\d+)", readme.notebook_cell()).group(1))  # type: ignore[union-attr]
    assert state == "completed" and n_trials == trials and 0 <= best < trials
    # watch() ran to the end, sweep.plot() drew its figures, and nobody asked about news.
    assert f"{trials}/{trials}" in text, text[-3000:]
    page.screenshot(path=str(tmp_path / "lab.png"))
    # The title plotly draws in the figure (an SVG text): there only if the plot rendered.
    page.get_by_text("Optimization History Plot").first.wait_for(timeout=60_000)
    assert page.get_by_text(NEWS_PROMPT).count() == 0

    # The sweeps page (behind the hub login) lists the sweep, its trials and the model.
    page.goto(f"{platform.url}services/tuner/#sweep={sweep_id}")
    page.locator(f"#sweeps tr[data-sweep-id='{sweep_id}']").wait_for()
    assert "completed" in page.locator(f"#sweeps tr[data-sweep-id='{sweep_id}']").inner_text()
    page.locator("#trials tbody tr").nth(trials - 1).wait_for()
    assert page.locator("#trials tbody tr").count() == trials
    page.locator("#history-chart .plot-container").wait_for()
    model_row = page.locator("#models tr[data-model='digits'][data-version='1']")
    model_row.wait_for()
    assert "production" in model_row.inner_text()
    # The GPU pool section (everyone's holders) rendered too: the models come after it.
    assert "GPUs held" in page.locator("#pool-summary").inner_text()
    page.screenshot(path=str(tmp_path / "sweeps.png"), full_page=True)

    # A second user, created on the Accounts page, sees none of it and cannot cancel it.
    page.goto(f"{platform.url}hub/tunehub/accounts")
    page.fill("input[name=username]", "bob")
    page.click("text=Create account")
    bob_password = page.locator("#new-password").inner_text()
    status, body = hub_api(page, "POST", "/hub/api/users/bob/tokens",
                           {"scopes": ["custom:tuner:read", "custom:tuner:submit",
                                       "access:services!service=tuner"], "note": "test"})
    assert status == 201, body
    bob_token = json.loads(body)["token"]
    api = f"{platform.url}services/tuner/api/v1/"
    bob = httpx.Client(base_url=api, headers={"Authorization": f"token {bob_token}"}, timeout=30)
    assert bob.get("sweeps").json() == []
    for method, path in [("GET", f"sweeps/{sweep_id}"), ("POST", f"sweeps/{sweep_id}/cancel"),
                         ("GET", f"sweeps/{sweep_id}/trials")]:
        r = bob.request(method, path)
        assert r.status_code == 404 and "not found" in r.json()["error"], (path, r.text)
    r = bob.post("models/digits/versions/1/promote", json={"stage": "canary"})
    assert r.status_code == 404, r.text

    bob_page = browser.new_context().new_page()
    bob_page.set_default_timeout(60_000)
    login(bob_page, platform.url, "bob", bob_password)
    bob_page.goto(f"{platform.url}services/tuner/")
    bob_page.locator("#no-sweeps").wait_for(state="visible")
    assert bob_page.locator(f"#sweeps tr[data-sweep-id='{sweep_id}']").count() == 0

    # The sweep is untouched.
    page.goto(f"{platform.url}services/tuner/")
    admin_api = page.evaluate(
        f"""fetch('{api}sweeps/{sweep_id}', {{headers: {{'X-XSRFToken':
            document.querySelector('meta[name="xsrf-token"]').content}}}}).then(r => r.json())""")
    assert admin_api["state"] == "completed"
    platform.stop()


def test_the_readme_demo_and_serve_as_written(tmp_path: Path) -> None:
    """The README's ``make demo`` row: the demo, then its serve command, then the predict
    route it names, each as written, from the checkout, with no ``TUNEHUB_*`` variable set and
    a fresh home."""
    home = tmp_path / "person"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHUB_")}
    env["HOME"] = str(home)
    if os.geteuid() == 0:
        (home / ".tunehub").mkdir()  # root's default is this when it exists, else /var/lib
    row = readme.entry_point("make demo")
    demo = subprocess.run(["bash", "-c", "make demo"], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"promoted|production", demo.stdout), demo.stdout[-3000:]
    serve_cmd, route = readme.commands_in(row)[:2]
    method, path = route.split()
    server = subprocess.Popen(["bash", "-c", serve_cmd], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        assert server.stdout is not None
        said = ""
        for line in server.stdout:
            said += line
            if "Ctrl-C stops" in line:
                break
        found = re.search(r"http://\S+:predict", said)
        assert found and found.group(0).endswith(path), said
        url = found.group(0)

        def answered() -> httpx.Response | None:
            try:
                return httpx.request(method, url, json={"instances": [[0.0] * 64]}, timeout=60)
            except httpx.TransportError:
                return None  # not listening yet

        r = wait_for(answered, timeout=120, what="tunehub model serve to answer")
        assert r.status_code == 200, r.text
        assert len(r.json()["predictions"][0]) == 10  # one probability per digit
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
