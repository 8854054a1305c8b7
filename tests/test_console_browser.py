"""The console in a real browser: headless Chromium (Debian's), driven by Selenium through Debian's
chromedriver (``fakes.browser``), against the real app on loopback with the network unreachable.

One person's session, in order: sign in; the overview counts decisions made through the API in
this test; filter the list, open a decision and record its outcome, then see it on the calibration
page; settle the review of an API check in the queue and read the verdict back through
``GET /v1/reviews/{id}``; settle the review of an in-process graph paused at its policy gate and
resume the thread with the settled value, seeing the reviewed call run; and ``/docs`` renders.
Each page's screenshot is saved (``fakes.browser.ARTIFACTS``).

System 1 is a Jev fake and the policy's bands make every answer a review (``review_me``) or an
allow (``let_through``), so the server starts in a second and every verdict is certain.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from fastslow.api.store import DecisionStore
from fastslow.graphs import resume_reviewed
from fastslow.router.settings import JevSettings

from fakes.api_server import RunningApi, api_client, create_key, running_api, test_settings
from fakes.browser import browser, screenshot  # noqa: F401  (fixture)
from fakes.jev_server import JevFakeServer
from fakes.review_graphs import REVIEW_POLICY, gated_graph, scripted_router

pytestmark = pytest.mark.browser

WAIT_S = 60  # a loaded CI machine runs this beside the rest of the suite


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    engine = JevFakeServer("jev")
    engine.start()
    tmp: Path = tmp_path_factory.mktemp("console")
    policy = tmp / "policy.yaml"
    policy.write_text(REVIEW_POLICY, encoding="utf-8")
    settings = test_settings(
        tmp, policy_file=policy, engine="jev", jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0)
    )
    try:
        with running_api(settings) as running:
            yield running
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def keys(api: RunningApi) -> dict[str, str]:
    return {
        "reviewer": create_key(api.settings, "acme", scopes=("review", "read")),
        "agent": create_key(api.settings, "acme", scopes=("check",)),
    }


def _until(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(expected_conditions.presence_of_element_located((By.ID, element_id)))


def _until_url(driver: Any, part: str) -> None:
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(expected_conditions.url_contains(part))


def _sign_in(driver: Any, api: RunningApi, key: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{api.url}/console")  # a page without a session sends the browser to sign in
    _until(driver, "signin-key").send_keys(key)
    driver.find_element("id", "signin-submit").click()
    _until(driver, "overview-stats")


async def _check(api: RunningApi, key: str, policy: str, command: str) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.post(
            "/v1/policy-check",
            json={"policies": [policy], "tool_call": {"name": "shell", "arguments": {"command": command}}},
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_sign_in_and_the_overview_counts_decisions_made_through_the_api(
    api: RunningApi,
    keys: dict[str, str],
    browser: Any,  # noqa: F811
) -> None:
    browser.delete_all_cookies()
    browser.get(f"{api.url}/console")
    _until(browser, "signin-key")
    screenshot(browser, "console-sign-in")
    for command in ("ls", "git status", "cat README.md"):
        assert (await _check(api, keys["agent"], "let_through", command))["verdict"] == "allow"
    _sign_in(browser, api, keys["reviewer"])
    decisions = int(_until(browser, "stat-decisions").get_attribute("data-value"))
    assert decisions >= 3
    assert _until(browser, "chart-decisions").find_elements("css selector", "rect")
    screenshot(browser, "console-overview")

    await _check(api, keys["agent"], "let_through", "pwd")
    browser.refresh()
    assert int(_until(browser, "stat-decisions").get_attribute("data-value")) == decisions + 1


async def test_filter_the_list_open_a_decision_record_its_outcome_and_see_it_calibrated(
    api: RunningApi,
    keys: dict[str, str],
    browser: Any,  # noqa: F811
) -> None:
    from selenium.webdriver.support.ui import Select

    await _check(api, keys["agent"], "review_me", "touch /tmp/x")
    _sign_in(browser, api, keys["reviewer"])
    browser.find_element("id", "nav-decisions").click()
    Select(_until(browser, "filter-task")).select_by_value("let_through")
    browser.find_element("id", "filter-submit").click()
    # The filtered page, not the one the click left: its table would go stale under the reads below.
    _until_url(browser, "task=let_through")
    rows = _until(browser, "decisions-table").find_elements("css selector", "tbody tr[data-decision-id]")
    assert rows and all(row.find_elements("tag name", "td")[1].text == "let_through" for row in rows)
    assert "task=let_through" in browser.current_url
    screenshot(browser, "console-decisions")

    decision_id = rows[0].get_attribute("data-decision-id")
    browser.find_element("id", f"decision-link-{decision_id}").click()
    assert _until(browser, "chart-distribution").find_elements("css selector", "rect")
    assert _until(browser, "state-digest").text  # the task keeps no state text: its hash is shown
    screenshot(browser, "console-decision")
    label = _until(browser, "outcome-label")
    if label.tag_name == "select":
        Select(label).select_by_value("allow")
    else:
        label.send_keys("allow")
    browser.find_element("id", "outcome-submit").click()
    _until(browser, "outcome-recorded")

    browser.get(f"{api.url}/console/calibration?task=let_through")
    assert _until(browser, "calibration-labelled").get_attribute("data-labelled") == "1"
    screenshot(browser, "console-calibration")


async def test_settle_the_review_of_an_api_check_and_read_the_verdict_over_the_api(
    api: RunningApi,
    keys: dict[str, str],
    browser: Any,  # noqa: F811
) -> None:
    checked = await _check(api, keys["agent"], "review_me", "rm -rf /srv/<b>data</b>")
    review_id = checked["review_id"]
    assert checked["verdict"] == "review" and review_id
    _sign_in(browser, api, keys["reviewer"])
    browser.find_element("id", "nav-reviews").click()
    card = _until(browser, f"review-{review_id}")
    assert "rm -rf /srv/<b>data</b>" in card.text  # shown as text, never as markup
    screenshot(browser, "console-reviews")
    browser.find_element("id", f"settle-note-{review_id}").send_keys("the user asked for it")
    browser.find_element("id", f"settle-allow-{review_id}").click()
    _until(browser, "settle-done")

    async with api_client(api.url, keys["reviewer"]) as client:
        review = (await client.get(f"/v1/reviews/{review_id}")).json()
    assert (review["status"], review["verdict"], review["note"]) == ("allowed", "allow", "the user asked for it")
    assert review["settled_at"] is not None and review["settled_by"]


executed: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    executed.append(command)
    return "ok"


async def test_settle_the_review_of_a_graph_paused_at_its_gate_and_resume_the_thread(
    api: RunningApi,
    keys: dict[str, str],
    browser: Any,  # noqa: F811
) -> None:
    assert api.settings.policy_file is not None
    url = api.settings.database_url or f"sqlite+aiosqlite:///{api.settings.resolved_data_dir() / 'fastslow.sqlite3'}"
    async with await DecisionStore.open(url, migrate=False) as store:
        # The same decision log as the server's; System 1 a script 0.6 sure of harm: review_me's band.
        router = scripted_router(api.settings.policy_file).with_sink(store.sink("acme", write_behind=True))
        call = {"name": "shell", "args": {"command": "rm -rf build/"}, "id": "call-1"}
        app = gated_graph(router, shell, call)
        config = {"configurable": {"thread_id": f"thread-{uuid.uuid4().hex[:8]}"}}
        paused = await app.ainvoke({"messages": [HumanMessage("clean the build folder")]}, config)
        review_id = paused["__interrupt__"][0].value["review_id"]
        assert executed == []
        # The graph's write-behind decision committed before the browser steps: they block this
        # test's event loop, and a commit caught mid-transaction would hold SQLite's write lock
        # from the server that is asked to settle the review meanwhile.
        await store.flush()

        _sign_in(browser, api, keys["reviewer"])
        browser.get(f"{api.url}/console/reviews")
        card = _until(browser, f"review-{review_id}")
        assert config["configurable"]["thread_id"] in card.text  # the thread it belongs to
        browser.find_element("id", f"settle-allow-{review_id}").click()
        _until(browser, "settle-done")

        done = await resume_reviewed(app, config, store, tenant="acme")
    assert executed == ["rm -rf build/"]  # the reviewed call ran
    assert done["messages"][-1].content == "done"


def test_the_docs_render_with_the_network_unreachable(api: RunningApi, browser: Any) -> None:  # noqa: F811
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Nothing but loopback is reachable from this browser: another host fails to load at all.
    with pytest.raises(WebDriverException, match="ERR_"):
        browser.get("http://192.0.2.1/")
    browser.get(f"{api.url}/docs")
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"))
    assert browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")  # the operations are listed
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(name.startswith(api.url) for name in loaded), loaded
    screenshot(browser, "docs")
