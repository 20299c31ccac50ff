"""The browser side of the service: the page's files (static HTML + JS from api/web_assets, no
build step) and the API docs at `/docs` and `/redoc` with their assets served from the package
(fastapi-offline ships Swagger UI and ReDoc), so both work without reaching a CDN.

`install_web(app)` mounts the files, serves the docs and adds the security headers to every
response (SecurityHeadersMiddleware); the page's routes (`/`, its config,
the memory timeline of a finished plan as JSON, drawn client-side) are the router
planner.api.routers.page. The page reads the /v1 API with the key the user typed
(localStorage, sent as Bearer).
"""

from __future__ import annotations

from importlib import resources as package_files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ASSETS_DIR = Path(__file__).resolve().parent / "web_assets"
PAGE_PREFIX = "/web"
DOCS_ASSETS_PREFIX = "/docs-assets"
# Nothing but this server: the docs bundles still name a CDN here and there (ReDoc's logo), and
# the browser must not try it. Swagger UI's start-up script is inline, hence 'unsafe-inline'
# there; the page itself runs no inline script.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; "
    "base-uri 'self'; form-action 'self'"
)
# On every response (the page, its files, the API's JSON): no MIME sniffing, no Referer with a
# plan id leaving the site, never framed (clickjacking). A response with its own CSP keeps it.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
DEFAULT_CSP = "frame-ancestors 'none'"


class SecurityHeadersMiddleware:
    """Adds SECURITY_HEADERS (and DEFAULT_CSP where a response sets no policy) to every HTTP
    response; plain ASGI, so streamed bodies pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("Content-Security-Policy", DEFAULT_CSP)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def docs_assets_dir() -> Path:
    """Swagger UI and ReDoc files as shipped by the fastapi-offline package."""
    return Path(str(package_files.files("fastapi_offline") / "static"))


def examples_dir() -> Path:
    return Path(str(package_files.files("planner") / "examples"))


def _drop_routes(app: FastAPI, paths: set[str]) -> None:
    # FastAPI adds its CDN-based docs routes in its constructor; ours replace them.
    kept: list[BaseRoute] = [
        r for r in app.router.routes if not (isinstance(r, Route) and r.path in paths)
    ]
    app.router.routes[:] = kept


def install_web(app: FastAPI) -> None:
    """Serve the page's files (`/web/static`, `/web/examples`) and the API docs (`/docs`,
    `/redoc`, their assets offline); the page's routes are planner.api.routers.page."""
    docs_url = app.docs_url or "/docs"
    redoc_url = app.redoc_url or "/redoc"
    openapi_url = app.openapi_url or "/openapi.json"
    _drop_routes(app, {docs_url, redoc_url})
    app.add_middleware(SecurityHeadersMiddleware)
    app.mount(DOCS_ASSETS_PREFIX, StaticFiles(directory=docs_assets_dir()), name="docs-assets")
    app.mount(PAGE_PREFIX + "/static", StaticFiles(directory=ASSETS_DIR), name="web-static")
    # The bundled example graph: the page's "try it" needs no file of the user's.
    app.mount(PAGE_PREFIX + "/examples", StaticFiles(directory=examples_dir()), name="web-examples")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=app.title + " - API docs",
            swagger_js_url=f"{root}{DOCS_ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_PREFIX}/favicon.png",
            oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
            # The key typed into "Authorize" survives a reload, as the page's own key does.
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}),
                                   "persistAuthorization": True},
        )
        html.headers["Content-Security-Policy"] = DOCS_CSP
        return html

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_redoc_html(
            openapi_url=root + openapi_url,
            title=app.title + " - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS_PREFIX}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS_PREFIX}/favicon.png",
            with_google_fonts=False,
        )
        html.headers["Content-Security-Policy"] = DOCS_CSP
        return html

