"""The hub journey in a real browser (Debian chromium driven by Playwright): ``tunehub up``,
log in, start a server, open JupyterLab, run a cell that submits the digits sweep and watches
it finish, see the promoted model on the sweeps page; a second user can neither see nor cancel
that sweep."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hub_fixtures import Platform

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
CELL = """\
import os, tuner
sweep = tuner.Sweep.submit(os.path.join(os.environ["TUNEHUB_DATA"], "digits", "sweep.yaml"),
                           trials=3, env={"DIGITS_EPOCHS": "3"})
sweep.watch()
print("SWEEP-DONE", sweep.id, sweep.state, sweep.best["number"], len(sweep.trials()))
"""


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


def login(page: Any, url: str, username: str, password: str) -> None:
    page.goto(f"{url}hub/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/(hub/home|hub/spawn.*|user/.*)$"), timeout=60_000)


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


def test_notebook_cell_submits_a_sweep_and_the_sweeps_page_shows_it(
    platform: Platform, browser: Any, tmp_path: Path
) -> None:
    platform.start()
    assert platform.password, platform.output
    page = browser.new_page()
    page.set_default_timeout(120_000)
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
    page.keyboard.insert_text(CELL)
    page.keyboard.press("Shift+Enter")
    outputs = page.locator(".jp-OutputArea-output")
    outputs.filter(has_text=re.compile(r"SWEEP-DONE \d|Error")).first.wait_for(timeout=600_000)
    text = "\n".join(outputs.all_inner_texts())
    assert re.search(r"SWEEP-DONE \d", text), text[-3000:]
    fields = text.split("SWEEP-DONE ", 1)[1].split()
    sweep_id, state, best, n_trials = int(fields[0]), fields[1], int(fields[2]), int(fields[3])
    assert state == "completed" and n_trials == 3 and 0 <= best < 3
    page.screenshot(path=str(tmp_path / "lab.png"))

    # The sweeps page (behind the hub login) lists the sweep, its trials and the model.
    page.goto(f"{platform.url}services/tuner/#sweep={sweep_id}")
    page.locator(f"#sweeps tr[data-sweep-id='{sweep_id}']").wait_for()
    assert "completed" in page.locator(f"#sweeps tr[data-sweep-id='{sweep_id}']").inner_text()
    page.locator("#trials tbody tr").nth(2).wait_for()
    assert page.locator("#trials tbody tr").count() == 3
    page.locator("#history-chart .plot-container").wait_for()
    model_row = page.locator("#models tr[data-model='digits'][data-version='1']")
    model_row.wait_for()
    assert "production" in model_row.inner_text()
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
    assert platform.stop() == 0
