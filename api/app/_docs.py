"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), working with no network.

FastAPI's own pages load Swagger UI, ReDoc and a favicon from a CDN, and ReDoc's fonts from Google,
so on a closed network they are blank. These are the same pages, built by FastAPI's
``get_swagger_ui_html`` and ``get_redoc_html``, pointing at the same files served by the API itself:
the ``static/`` folder of the ``fastapi-offline`` package (only its files are used, none of its
code), mounted at ``ASSETS_URL``. Like the pages and ``/openapi.json``, the files need no key (only
``/v1/`` does) and stay out of the OpenAPI document.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "DOCS_URL", "REDOC_URL", "install_docs"]

DOCS_URL = "/docs"
"""Swagger UI, where FastAPI puts it."""
REDOC_URL = "/redoc"
"""ReDoc, where FastAPI puts it."""
ASSETS_URL = "/static/docs"
"""Where the pages' scripts, stylesheet and favicon are served."""
ASSETS_PACKAGE = ("fastapi_offline", "static")
"""The package folder they are served from: Swagger UI's and ReDoc's bundles as their CDN serves them."""
SWAGGER_UI_PARAMETERS: dict[str, object] = {"validatorUrl": None}
"""Swagger UI's validator badge would send the document's address to validator.swagger.io: off."""


def _root(request: Request) -> str:
    """The root path a proxy mounts the API under: the pages name their files and the document below it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and Swagger UI's OAuth2 redirect page with the files at ``ASSETS_URL``.

    The app is built without FastAPI's own pages (``docs_url=None, redoc_url=None``), with an
    ``openapi_url``, which these pages read.
    """
    openapi_url = app.openapi_url
    if openapi_url is None or app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("install_docs needs an app with openapi_url set and FastAPI's docs_url and redoc_url off")
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url
    # StaticFiles finds the package folder without importing the package, and fails here if it is missing.
    app.mount(ASSETS_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=root + oauth2_redirect_url if oauth2_redirect_url else None,
            init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters={**SWAGGER_UI_PARAMETERS, **(app.swagger_ui_parameters or {})},
        )

    async def redoc(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    async def swagger_ui_oauth2_redirect(_request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    # Pages for people, not operations: plain routes (GET and HEAD) outside the OpenAPI document,
    # as FastAPI adds its own.
    app.add_route(DOCS_URL, swagger_ui, include_in_schema=False)
    app.add_route(REDOC_URL, redoc, include_in_schema=False)
    if oauth2_redirect_url:
        app.add_route(oauth2_redirect_url, swagger_ui_oauth2_redirect, include_in_schema=False)
