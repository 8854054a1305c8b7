"""The operator's console over a real running API: sessions, tenants, CSRF, escaping, scopes, and its pages.

Every request goes over HTTP to one server for the module, as a browser's would, with cookies kept
by the client. Each test works in a tenant of its own, so the counts it reads are its own.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from starlette.responses import Response

from fastslow.api.app import create_app
from fastslow.api.console._auth import SESSION_COOKIE, ConsoleAuth
from fastslow.api.store import ApiKey, DecisionStore, database_url_for
from fastslow.router.settings import ConsoleSettings

from fakes.api_server import RunningApi, api_client, running_api, test_policy, test_settings

SCRIPT = "<script>alert('owned')</script>"
DROP = {"name": "run_sql", "arguments": {"query": "DROP TABLE customers;"}}
REVIEW_TASK = "console_review"
"""A check whose review band is everything: each call is a ``review``, and its state is kept."""
UNKNOWN_ID = "0123456789abcdef0123456789abcdef"


def _policy(directory: Path) -> Path:
    path = test_policy(directory, split_checks=False)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    safety = doc["tasks"]["tool_safety"]
    rule = {**safety["rules"]["destructive_action"], "allow_at": 0.0, "deny_at": 1.0}
    doc["tasks"][REVIEW_TASK] = {**safety, "store_state": True, "rules": {"destructive_action": rule}}
    # What `fastslow tune` would have written: the calibration page judges drift against it.
    fit = {"by": "fastslow tune", "date": "2026-01-01T00:00:00Z", "target_accuracy": 0.9, "held_out": {"kept": 0.8}}
    doc["tasks"]["support"]["fitted"] = {"thresholds": fit}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    folder = tmp_path_factory.mktemp("console")
    settings = test_settings(
        folder, policy_file=_policy(folder), console={"secret": "x" * 40}, auth_throttle={"failures": 3}
    )
    with running_api(settings) as running:
        yield running


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:2000]
    return found.group(1)


async def _sign_in(client: httpx2.AsyncClient, key: str, *, next: str = "/console") -> httpx2.Response:
    form = await client.get("/console/sign-in")
    return await client.post("/console/sign-in", data={"csrf": _csrf(form.text), "key": key, "next": next})


@asynccontextmanager
async def _browser(api: RunningApi, key: str | None = None) -> AsyncIterator[httpx2.AsyncClient]:
    async with api_client(api.url) as client:
        if key is not None:
            signed = await _sign_in(client, key)
            assert signed.status_code == 303, signed.text
        yield client


async def _route(api: RunningApi, key: str, text: str) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.post(
            "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": text}]}
        )
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()["decision"]
    return decision


async def _check(api: RunningApi, key: str, **item: Any) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/policy-check", json={"policies": [REVIEW_TASK], **item})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["verdict"] == "review" and body["review_id"], body
    return body


@asynccontextmanager
async def _store(api: RunningApi) -> AsyncIterator[DecisionStore]:
    async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
        yield store


# -- security ----------------------------------------------------------------------------------------


async def test_no_page_is_reachable_without_a_session(api: RunningApi) -> None:
    async with _browser(api) as client:
        for path in ("/console", "/console/decisions", f"/console/decisions/{UNKNOWN_ID}", "/console/calibration"):
            response = await client.get(path, params={"task": "support"})
            assert response.status_code == 303, path
            assert response.headers["location"].startswith("/console/sign-in?next=%2Fconsole"), path
        for path in ("/console/reviews", f"/console/reviews/{UNKNOWN_ID}"):
            assert (await client.get(path)).status_code == 303
        posts = ("/console/sign-out", f"/console/decisions/{UNKNOWN_ID}/outcome", f"/console/reviews/{UNKNOWN_ID}")
        for path in posts:
            assert (await client.post(path, data={"csrf": "x", "verdict": "allow"})).status_code == 403, path
        # A forged cookie is no session either.
        client.cookies.set(SESSION_COOKIE, "eyJrIjoiYSJ9.forged.signature", path="/console")
        assert (await client.get("/console")).status_code == 303
        # What is served without a session: the sign-in page, the stylesheet, and the root's way in.
        sign_in = await client.get("/console/sign-in")
        css = await client.get("/console/static/console.css")
        root = await client.get("/")
    assert sign_in.status_code == 200 and 'id="signin-key"' in sign_in.text
    assert sign_in.headers["content-security-policy"].startswith("default-src 'none'")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert root.status_code == 307 and root.headers["location"] == "/console"


async def test_signing_in_sets_a_strict_http_only_cookie_bound_to_the_key(api: RunningApi) -> None:
    tenant = _tenant()
    key = await api.key(tenant, scopes=("read",))
    async with _browser(api) as client:
        signed = await _sign_in(client, key, next="/console/decisions?task=support")
        page = await client.get(signed.headers["location"])
    assert signed.status_code == 303 and signed.headers["location"] == "/console/decisions?task=support"
    cookie = next(c for c in signed.headers.get_list("set-cookie") if c.startswith(f"{SESSION_COOKIE}="))
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= flags and "secure" not in flags
    assert "samesite=strict" in cookie.lower() and "path=/console" in cookie.lower()
    assert key not in cookie and key[3:12] not in cookie  # the key itself never travels back
    assert page.status_code == 200 and tenant in page.text and 'id="decisions-empty"' in page.text


def test_the_session_cookie_is_secure_when_configured() -> None:
    auth = ConsoleAuth(ConsoleSettings(secret="y" * 40, secure_cookie=True))
    now = datetime.now(UTC)
    record = ApiKey(id="k1", tenant="acme", name=None, prefix="fs_abcdefgh", created_at=now, revoked_at=None)
    signed_in, signed_out = Response(), Response()
    auth.sign_in(signed_in, record, path="/console")
    auth.sign_out(signed_out, path="/console")
    for response in (signed_in, signed_out):
        cookie = next(
            v.decode() for k, v in response.raw_headers if k == b"set-cookie" and SESSION_COOKIE.encode() in v
        )
        assert all(flag in cookie.lower() for flag in ("; secure", "; httponly", "samesite=strict", "path=/console"))


async def test_another_tenants_decision_and_review_are_not_found(api: RunningApi) -> None:
    owner = _tenant()
    checked = await _check(api, await api.key(owner), tool_call=DROP)
    decision_id, review_id = checked["decision_id"], checked["review_id"]
    stranger = await api.key(_tenant(), scopes=("review", "read"))
    async with _browser(api, stranger) as client:
        csrf = _csrf((await client.get("/console")).text)
        seen = [
            await client.get(f"/console/decisions/{decision_id}"),
            await client.get(f"/console/reviews/{review_id}"),
            await client.post(f"/console/decisions/{decision_id}/outcome", data={"csrf": csrf, "label": "deny"}),
            await client.post(f"/console/reviews/{review_id}", data={"csrf": csrf, "verdict": "deny"}),
            await client.get("/console/decisions/not-an-id"),
        ]
        queue = await client.get("/console/reviews")
    assert [r.status_code for r in seen] == [404] * 5
    assert review_id not in queue.text
    async with _store(api) as store:
        review = await store.get_review(review_id, tenant=owner)
        assert review is not None and review.pending
        assert await store.outcomes(tenant=owner) == []


async def test_forms_without_the_sessions_csrf_token_are_refused_and_change_nothing(api: RunningApi) -> None:
    tenant = _tenant()
    checked = await _check(api, await api.key(tenant), text="shell: ls -la /tmp")
    decision_id, review_id = checked["decision_id"], checked["review_id"]
    key = await api.key(tenant, scopes=("review", "read"))
    async with _browser(api, key) as client:
        outcome = f"/console/decisions/{decision_id}/outcome"
        refused = [
            await client.post(outcome, data={"label": "deny"}),
            await client.post(outcome, data={"label": "deny", "csrf": "not-the-token"}),
            await client.post(f"/console/reviews/{review_id}", data={"verdict": "deny", "csrf": ""}),
            await client.post("/console/sign-out", data={"csrf": "not-the-token"}),
        ]
        still_in = await client.get("/console")
    async with _browser(api) as fresh:
        await fresh.get("/console/sign-in")
        no_nonce = await fresh.post("/console/sign-in", data={"key": key, "csrf": "guess"})
    assert [r.status_code for r in refused] == [403, 403, 403, 403]
    assert still_in.status_code == 200
    assert no_nonce.status_code == 403 and SESSION_COOKIE not in no_nonce.headers.get("set-cookie", "")
    async with _store(api) as store:
        review = await store.get_review(review_id, tenant=tenant)
        assert review is not None and review.pending
        assert await store.outcomes(tenant=tenant) == []


async def test_a_stored_script_renders_as_text_on_the_decision_page_and_in_the_queue(api: RunningApi) -> None:
    tenant = _tenant()
    check_key = await api.key(tenant)
    as_text = await _check(api, check_key, text=SCRIPT)
    as_argument = await _check(api, check_key, tool_call={"name": "run_sql", "arguments": {"query": SCRIPT}})
    async with _browser(api, await api.key(tenant, scopes=("review", "read"))) as client:
        decision = await client.get(f"/console/decisions/{as_text['decision_id']}")
        queue = await client.get("/console/reviews")
        review = await client.get(f"/console/reviews/{as_argument['review_id']}")
    assert decision.status_code == queue.status_code == review.status_code == 200
    for page in (decision, queue, review):
        assert "<script" not in page.text.lower()
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in decision.text  # the kept state, as text
    assert queue.text.count("&lt;script&gt;") >= 2 and "&lt;script&gt;" in review.text


async def test_a_revoked_keys_session_ends_at_its_next_request(api: RunningApi) -> None:
    tenant = _tenant()
    key = await api.key(tenant, scopes=("read",))
    async with _browser(api, key) as client:
        assert (await client.get("/console")).status_code == 200
        async with _store(api) as store:
            record = await store.authenticate(key)
            assert record is not None and await store.revoke_key(record.id)
        ended = await client.get("/console/reviews")
        again = await _sign_in(client, key)
    assert ended.status_code == 303
    assert ended.headers["location"].startswith("/console/sign-in?next=%2Fconsole%2Freviews&notice=ended")
    assert f'{SESSION_COOKIE}=""' in ended.headers["set-cookie"]  # the browser drops it
    # Signing in with it again fails (401; 429 once this address failed too often: see the throttle test).
    assert again.status_code in (401, 429) and SESSION_COOKIE not in again.headers.get("set-cookie", "")


async def test_a_check_only_key_cannot_sign_in(api: RunningApi) -> None:
    key = await api.key(_tenant(), scopes=("check",))
    async with _browser(api) as client:
        refused = await _sign_in(client, key)
        after = await client.get("/console")
    assert refused.status_code == 403 and "read or review scope" in refused.text
    assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")
    assert after.status_code == 303


async def test_a_read_key_sees_no_forms_and_its_posts_are_refused(api: RunningApi) -> None:
    tenant = _tenant()
    checked = await _check(api, await api.key(tenant), tool_call=DROP)
    async with _browser(api, await api.key(tenant, scopes=("read",))) as client:
        decision = await client.get(f"/console/decisions/{checked['decision_id']}")
        queue = await client.get("/console/reviews")
        csrf = _csrf(queue.text)  # the sign-out form's: the session's own token
        posts = [
            await client.post(
                f"/console/decisions/{checked['decision_id']}/outcome", data={"csrf": csrf, "label": "deny"}
            ),
            await client.post(f"/console/reviews/{checked['review_id']}", data={"csrf": csrf, "verdict": "allow"}),
        ]
    assert decision.status_code == 200 and 'id="outcome-form"' not in decision.text
    assert queue.status_code == 200 and f'data-review-id="{checked["review_id"]}"' in queue.text
    assert "settle-form-" not in queue.text and 'id="reviews-read-only"' in queue.text
    assert [p.status_code for p in posts] == [403, 403] and "review scope" in posts[0].text
    async with _store(api) as store:
        review = await store.get_review(checked["review_id"], tenant=tenant)
        assert review is not None and review.pending and await store.outcomes(tenant=tenant) == []


async def test_failed_sign_ins_are_throttled_and_a_valid_key_still_signs_in(api: RunningApi) -> None:
    key = await api.key(_tenant(), scopes=("read",))
    statuses: list[int] = []
    async with _browser(api) as client:
        # The throttle counts per client address, and every test's client is 127.0.0.1: a failure
        # another test made counts too, so this fails until refused, at most `failures` + 1 times.
        for _ in range(4):
            failed = await _sign_in(client, "fs_" + "z" * 43)
            statuses.append(failed.status_code)
            if failed.status_code == 429:
                break
        valid = await _sign_in(client, key)
    assert statuses[-1] == 429 and set(statuses[:-1]) <= {401}
    assert int(failed.headers["retry-after"]) >= 1 and "Too many failed sign-ins" in failed.text
    assert valid.status_code == 303


async def test_without_the_console_the_root_leads_to_the_docs(tmp_path: Path) -> None:
    app = create_app(test_settings(tmp_path, console={"enabled": False}))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://console.test") as client:
        root = await client.get("/")
        console = await client.get("/console/sign-in")
    assert root.status_code == 307 and root.headers["location"] == "/docs"
    assert console.status_code == 404


# -- the pages ---------------------------------------------------------------------------------------


async def test_the_overview_shows_the_decisions_made_through_the_api(api: RunningApi) -> None:
    tenant = _tenant()
    check_key = await api.key(tenant)
    await _route(api, check_key, "My card keeps getting declined when I try to pay")
    routed = await _route(api, check_key, "The app crashes every time I open the reports page")
    await _check(api, check_key, tool_call=DROP)
    async with _browser(api, await api.key(tenant, scopes=("read",))) as client:
        every = await client.get("/console", params={"range": "7d"})
        support = await client.get("/console", params={"task": "support", "range": "24h"})
    assert every.status_code == support.status_code == 200
    assert 'id="stat-decisions" data-value="3"' in every.text
    assert 'id="stat-decisions" data-value="2"' in support.text and 'id="stat-kept" data-value="2"' in support.text
    assert f'data-version="{routed["policy_version"]}"' in support.text
    for chart in ("chart-decisions", "chart-kept", "table-latency", "range-30d", "nav-calibration", "nav-signout"):
        assert f'id="{chart}"' in support.text
    assert support.text.count("<svg") >= 2


async def test_the_decisions_list_filters_and_pages_by_cursor(api: RunningApi) -> None:
    tenant = _tenant()
    check_key = await api.key(tenant)
    texts = (
        "Where do I download last month's invoice?",
        "Push notifications stopped arriving",
        "I need to reset my PIN",
    )
    routed = {(await _route(api, check_key, text))["id"] for text in texts}
    checked = await _check(api, check_key, tool_call=DROP)
    ids = re.compile(r'<tr data-decision-id="([0-9a-f]{32})"')
    async with _browser(api, await api.key(tenant, scopes=("read",))) as client:
        first = await client.get("/console/decisions", params={"task": "support", "limit": 2})
        older = re.search(r'id="page-next" class="primary" href="([^"]+)"', first.text)
        assert older is not None
        second = await client.get(older.group(1).replace("&amp;", "&"))
        reviews = await client.get("/console/decisions", params={"verdict": "review"})
        bad = await client.get("/console/decisions", params={"after": "not-a-cursor", "since": "yesterday"})
    page_one, page_two = ids.findall(first.text), ids.findall(second.text)
    assert len(page_one) == 2 and len(page_two) == 1 and set(page_one) | set(page_two) == routed
    assert 'id="page-next"' not in second.text and 'id="page-first"' in second.text
    assert ids.findall(reviews.text) == [checked["decision_id"]]
    assert bad.status_code == 200 and len(ids.findall(bad.text)) == 4 and bad.text.count("filter-problem") == 2


async def test_a_decision_page_shows_its_distribution_and_records_an_outcome(api: RunningApi) -> None:
    tenant = _tenant()
    decision = await _route(api, await api.key(tenant), "Why was I billed $49 when my plan is $29?")
    labelled = re.compile(r'id="calibration-labelled" data-labelled="(\d+)"')
    async with _browser(api, await api.key(tenant, scopes=("review", "read"))) as client:
        before = await client.get("/console/calibration", params={"task": "support"})
        page = await client.get(f"/console/decisions/{decision['id']}")
        recorded = await client.post(
            f"/console/decisions/{decision['id']}/outcome",
            data={"csrf": _csrf(page.text), "label": "billing", "note": "checked by hand"},
        )
        shown = await client.get(recorded.headers["location"])
        wrong = await client.post(
            f"/console/decisions/{decision['id']}/outcome", data={"csrf": _csrf(page.text), "label": "weather"}
        )
        after = await client.get("/console/calibration", params={"task": "support"})
    assert page.status_code == 200 and 'id="outcome-form"' in page.text and 'id="outcome-submit"' in page.text
    for option in decision["probabilities"]:
        assert f'data-label="{option}"' in page.text  # a bar per option
    assert "min confidence" in page.text and 'id="state-digest"' in page.text  # support keeps no state
    assert recorded.status_code == 303 and 'id="outcome-recorded"' in shown.text
    assert wrong.status_code == 422 and 'id="outcome-error"' in wrong.text
    count_before, count_after = (labelled.search(p.text) for p in (before, after))
    assert count_before is not None and count_after is not None
    assert int(count_after.group(1)) == int(count_before.group(1)) + 1
    assert 'id="calibration-too-few"' in after.text  # one outcome draws no curve
    assert 'id="drift-status" data-status="ok"' in after.text and "too few to judge" in after.text
    assert "fastslow tune" in after.text  # the fitted: record of the policy in force
    async with _store(api) as store:
        pairs = await store.outcomes(tenant=tenant)
    assert [(d.id, o.label, o.note) for d, o in pairs] == [(decision["id"], "billing", "checked by hand")]


async def test_the_review_queue_shows_a_pending_review_and_settles_it_once(api: RunningApi) -> None:
    tenant = _tenant()
    checked = await _check(api, await api.key(tenant), tool_call=DROP)
    review_id = checked["review_id"]
    async with _browser(api, await api.key(tenant, scopes=("review", "read"))) as client:
        queue = await client.get("/console/reviews")
        form = {"csrf": _csrf(queue.text), "verdict": "deny", "label": "deny", "note": "drops a table"}
        settled = await client.post(f"/console/reviews/{review_id}", data=form)
        after = await client.get(settled.headers["location"])
        late = await client.post(f"/console/reviews/{review_id}", data={**form, "verdict": "allow", "label": ""})
    assert queue.status_code == 200 and f'id="review-{review_id}"' in queue.text
    assert f'id="settle-allow-{review_id}"' in queue.text and f'id="settle-label-{review_id}"' in queue.text
    assert "run_sql" in queue.text and "DROP TABLE customers;" in queue.text
    assert settled.status_code == 303 and 'id="settle-done"' in after.text
    assert f'id="review-{review_id}"' not in after.text and f'<tr data-review-id="{review_id}">' in after.text
    assert late.status_code == 409 and 'id="settle-conflict" role="alert" data-verdict="deny"' in late.text
    async with _store(api) as store:
        review = await store.get_review(review_id, tenant=tenant)
        pairs = await store.outcomes(tenant=tenant)
    assert review is not None and (review.status, review.verdict, review.note) == ("denied", "deny", "drops a table")
    assert [(d.id, o.label) for d, o in pairs] == [(checked["decision_id"], "deny")]  # the rule's label
