"""`POST /v1/systemone`: the official `typesafe-sdk` works against fastslow unchanged.

JSON bodies, `Content-Encoding: zstd` bodies and multipart bodies with image assets, as the SDK
sends them, over HTTP to the real app; images go to an engine that takes them (the Jev client, in
front of a fake Jev server) or are refused with a 422 naming `assets`.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest
import zstandard
from typesafe_sdk import (
    AsyncTypeSafeClient,
    Choice,
    Image,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeUnprocessableEntityError,
)

from fastslow.router.settings import JevSettings

from fakes.api_server import RunningApi, api_client, create_key, running_api, sdk_http_client, test_settings
from fakes.jev_server import running_jev_server

QUESTIONS: dict[str, Any] = {
    "refund": Noul(instructions="Does the customer ask for a refund?"),
    "category": Choice(
        instructions="What is this ticket about?",
        criteria={"billing": None, "technical": "Bugs, outages", "other": None},
    ),
    "urgency": Score(instructions="How urgent is this?", criteria=["Can wait", "This week", "Today"]),
}
STATE = "I was charged twice. Please fix this ASAP and give me my money back."


def png_1x1() -> bytes:
    """A valid 1x1 PNG, made here so the test needs no image library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "acme")


class Sent:
    """The headers of every request the SDK sent."""

    def __init__(self) -> None:
        self.headers: list[httpx2.Headers] = []

    async def __call__(self, request: httpx2.Request) -> None:
        self.headers.append(request.headers)


@pytest.fixture
async def sent() -> Sent:
    return Sent()


def _sdk(url: str, key: str, sent: Sent, **kw: Any) -> AsyncTypeSafeClient:
    http = sdk_http_client()
    http.event_hooks["request"].append(sent)
    return AsyncTypeSafeClient(api_key=key, base_url=url, http_client=http, retry=RetryPolicy(max_retries=0), **kw)


@pytest.fixture
async def sdk(api: RunningApi, key: str, sent: Sent) -> AsyncIterator[AsyncTypeSafeClient]:
    async with _sdk(api.url, key, sent, compression=False) as client:
        yield client


async def test_the_sdk_gets_calibrated_answers_in_jevs_shape(sdk: AsyncTypeSafeClient, sent: Sent) -> None:
    response = await sdk.system_one(STATE, QUESTIONS)
    assert 0.0 <= response.nouls["refund"].noul <= 1.0
    category = response.choices["category"]
    assert set(category.probabilities) == {"billing", "technical", "other"}
    assert sum(category.probabilities.values()) == pytest.approx(1.0)
    assert category.choice == max(category.probabilities, key=category.probabilities.__getitem__)
    urgency = response.scores["urgency"]
    assert set(urgency.probabilities) == {0, 1, 2} and urgency.legend[2] == "Today"
    assert urgency.score == pytest.approx(sum(i * p for i, p in urgency.probabilities.items()))
    assert response.model and response.request_id
    assert "content-encoding" not in sent.headers[0]


async def test_zstd_bodies_from_the_sdk_are_decoded(api: RunningApi, key: str, sent: Sent) -> None:
    long_state = {"ticket": STATE, "history": [f"earlier message {i}: still waiting for my refund" for i in range(60)]}
    async with _sdk(api.url, key, sent, compression="zstd") as client:
        response = await client.system_one(long_state, QUESTIONS)
    assert sent.headers[0]["content-encoding"] == "zstd"
    assert set(response.answers) == set(QUESTIONS)


async def test_an_image_for_an_engine_without_eyes_is_a_clear_422(sdk: AsyncTypeSafeClient, sent: Sent) -> None:
    image = Image(png_1x1())
    with pytest.raises(TypeSafeUnprocessableEntityError, match="does not take images") as caught:
        await sdk.system_one(["What is in this picture?", image], {"cat": Noul(instructions="Is it a cat?")})
    assert sent.headers[0]["content-type"].startswith("multipart/form-data")
    assert caught.value.status == 422
    assert caught.value.body["error"]["field"] == "assets"


async def test_images_reach_an_engine_that_takes_them(tmp_path: Any, sent: Sent) -> None:
    png = png_1x1()
    async with running_jev_server("jev") as jev:
        settings = test_settings(tmp_path, engine="jev", jev=JevSettings(base_url=jev.url, profile="jev"))
        with running_api(settings) as api:
            async with _sdk(api.url, await api.key("acme"), sent) as client:
                response = await client.system_one(
                    "What is in the picture <photo>?",
                    {"cat": Noul(instructions="Is there a cat in <photo>?")},
                    assets={"<photo>": Image(png)},
                )
    assert sent.headers[0]["content-type"].startswith("multipart/form-data")
    assert 0.0 <= response.nouls["cat"].noul <= 1.0
    [forwarded] = [r for r in jev.requests if r.path == "/v1/systemone"]
    assets = forwarded.json["assets"]
    received = [data for _type, data in forwarded.parts.values()]
    received += [base64.b64decode(a["data_base64"]) for a in assets.values() if "data_base64" in a]
    assert received == [png]
    assert list(assets) == ["<photo>"]


async def test_sdk_errors_map_to_the_sdks_exceptions(api: RunningApi, key: str, sent: Sent) -> None:
    async with _sdk(api.url, "fs_not-a-key", sent) as client:
        with pytest.raises(TypeSafeAuthenticationError):
            await client.system_one(STATE, QUESTIONS)
    async with _sdk(api.url, key, sent) as client:
        with pytest.raises(TypeSafeUnprocessableEntityError, match="at least 2"):
            await client.system_one(STATE, {"q": {"type": "choice", "criteria": {"only": None}}})


@pytest.mark.parametrize(
    ("headers", "content", "status", "field"),
    [
        ({"content-type": "application/json"}, b'{"state": "x", "questions": ', 422, "body"),
        ({"content-type": "application/json"}, b"\xff\xfe not utf-8", 422, "body"),
        # Named where limits.max_depth (64) is passed: the 65th array.
        ({"content-type": "application/json"}, b"[" * 50_000 + b"]" * 50_000, 422, ".".join(["0"] * 64)),
        ({"content-type": "text/plain"}, b"hello", 415, None),
        ({"content-type": "application/json", "content-encoding": "zstd"}, b"not zstd at all", 422, "body"),
        ({"content-type": "application/json", "content-encoding": "br"}, b"{}", 415, None),
    ],
)
async def test_bad_bodies_are_clear_errors(
    api: RunningApi, key: str, headers: dict[str, str], content: bytes, status: int, field: str | None
) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", content=content, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"].get("field") == field


def _multipart(request: dict[str, Any], **files: bytes) -> dict[str, Any]:
    import json

    parts: dict[str, Any] = {"request": (None, json.dumps(request), "application/json")}
    parts.update({name: (name, data, "image/png") for name, data in files.items()})
    return parts


@pytest.mark.parametrize(
    ("request_body", "files", "field"),
    [
        ({"state": "x <p>", "questions": {"q": {"type": "noul", "instructions": "y"}}}, {"asset-0": b"x"}, "assets"),
        (
            {
                "state": "x <p>",
                "questions": {"q": {"type": "noul", "instructions": "y"}},
                "assets": {"<p>": {"type": "image", "part": "asset-9"}},
            },
            {"asset-0": b"\x89PNG\r\n\x1a\n"},
            "assets.<p>.part",
        ),
        (
            {
                "state": "x <p>",
                "questions": {"q": {"type": "noul", "instructions": "y"}},
                "assets": {"<p>": {"type": "image", "data_base64": "%%%"}},
            },
            {},
            "assets.<p>.data_base64",
        ),
        (
            {
                "state": "x <p>",
                "questions": {"q": {"type": "noul", "instructions": "y"}},
                "assets": {"<p>": {"type": "video", "part": "asset-0"}},
            },
            {"asset-0": b"\x89PNG\r\n\x1a\n"},
            "assets.<p>.type",
        ),
    ],
)
async def test_bad_assets_are_422_naming_the_field(
    api: RunningApi, key: str, request_body: dict[str, Any], files: dict[str, bytes], field: str
) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", files=_multipart(request_body, **files))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


async def test_a_multipart_body_without_its_request_part_is_a_422(api: RunningApi, key: str) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", files={"asset-0": ("asset-0", b"\x89PNG", "image/png")})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "request"


async def test_zstd_multipart_is_decoded_too(api: RunningApi, key: str) -> None:
    body = {"state": "refund please", "questions": {"q": {"type": "noul", "instructions": "Asks for a refund?"}}}
    request = httpx2.Request("POST", f"{api.url}/v1/systemone", files=_multipart(body))
    raw = request.read()
    async with api_client(api.url, key) as client:
        response = await client.post(
            "/v1/systemone",
            content=zstandard.ZstdCompressor().compress(raw),
            headers={"content-type": request.headers["content-type"], "content-encoding": "zstd"},
        )
    assert response.status_code == 200, response.text
    assert response.json()["answers"]["q"]["type"] == "noul"
