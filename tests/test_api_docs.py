"""The documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), work on a closed network.

Every address a page names (its tags' ``src``, ``href`` and ``spec-url``, a ``url(...)`` in its
style, the ``url:`` of its script, any absolute address anywhere in it) is on the server itself, and
the server answers each with the file the page expects: a script, a stylesheet, an icon, the OpenAPI
document. None of it needs a key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import PurePosixPath
from urllib.parse import urljoin, urlsplit

import pytest

from fakes.api_server import RunningApi, api_client, running_api, test_settings

PAGES = ("/docs", "/redoc", "/docs/oauth2-redirect")
URL_ATTRIBUTES = {"src", "href", "spec-url", "srcset", "action", "data", "poster"}
EXPECTED = {
    ".js": ("javascript", 100_000),
    ".css": ("text/css", 10_000),
    ".png": ("image/png", 1_000),
    ".json": ("application/json", 1_000),
}
"""What a referenced file must be served as, by its suffix: a content type containing this, at least so many bytes."""


class _Attributes(HTMLParser):
    """Every attribute of every tag in a page, as (name, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.attributes: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes += [(name, value) for name, value in attrs if value is not None]


def _references(page: str) -> list[str]:
    """Every address a page names, as written."""
    parser = _Attributes()
    parser.feed(page)
    parser.close()
    found = [value for name, value in parser.attributes if name in URL_ATTRIBUTES]
    found += re.findall(r"url\(\s*['\"]?([^'\")\s]+)", page)  # CSS
    found += re.findall(r"\burl\s*:\s*['\"]([^'\"]+)", page)  # Swagger UI's document, in its script
    found += re.findall(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)]+", page)  # any absolute address anywhere
    return found


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


def test_references_are_read_from_tags_styles_and_scripts() -> None:
    # FastAPI's own ReDoc page, as it was: a CDN script and Google's fonts.
    page = (
        '<link href="https://fonts.googleapis.com/css?family=Montserrat" rel="stylesheet">'
        '<style>body { background: url("//cdn.example/b.png") }</style>'
        "<redoc spec-url=\"/openapi.json\"></redoc><script>const ui = X({url: '/openapi.json'})</script>"
        '<script src="https://cdn.jsdelivr.net/npm/redoc@2/bundles/redoc.standalone.js"> </script>'
    )
    found = _references(page)
    assert "https://fonts.googleapis.com/css?family=Montserrat" in found
    assert "//cdn.example/b.png" in found
    assert found.count("/openapi.json") == 2
    assert "https://cdn.jsdelivr.net/npm/redoc@2/bundles/redoc.standalone.js" in found


@pytest.mark.parametrize("path", PAGES)
async def test_a_docs_page_names_no_address_outside_the_server(api: RunningApi, path: str) -> None:
    async with api_client(api.url) as client:  # no key
        response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = f"{api.url}{path}"
    outside = [ref for ref in _references(response.text) if _origin(urljoin(page, ref)) != _origin(api.url)]
    assert outside == []


@pytest.mark.parametrize(
    ("path", "kinds"), [("/docs", {".js", ".css", ".png", ".json"}), ("/redoc", {".js", ".png", ".json"})]
)
async def test_every_file_a_docs_page_loads_is_served_without_a_key(
    api: RunningApi, path: str, kinds: set[str]
) -> None:
    async with api_client(api.url) as client:  # no key
        page = (await client.get(path)).text
        references = {urljoin(f"{api.url}{path}", ref) for ref in _references(page)}
        assert {PurePosixPath(urlsplit(url).path).suffix for url in references} == kinds
        for url in sorted(references):
            response = await client.get(url)
            content_type, least = EXPECTED[PurePosixPath(urlsplit(url).path).suffix]
            assert response.status_code == 200, url
            assert content_type in response.headers["content-type"], (url, response.headers["content-type"])
            assert len(response.content) >= least, url


async def test_swagger_ui_loads_the_served_document_and_asks_no_validator(api: RunningApi) -> None:
    async with api_client(api.url) as client:
        page = (await client.get("/docs")).text
        document = await client.get("/openapi.json")
    assert "url: '/openapi.json'" in page
    # Swagger UI's validator badge would send the document's address to validator.swagger.io.
    assert '"validatorUrl": null' in page
    assert document.status_code == 200 and "/v1/policy-check" in document.json()["paths"]
    # The pages and their files are for people, not operations.
    assert not {p for p in document.json()["paths"] if p.startswith(("/docs", "/redoc", "/static"))}
