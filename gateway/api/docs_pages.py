"""/docs (Swagger UI) and /redoc, served with the scripts and styles of an installed package, so that the API
docs open on a machine without internet. FastAPI's own pages load them from a CDN: there they were blank.

The assets are the copies the `fastapi-offline` package ships (Swagger UI 5, ReDoc 2, a favicon), mounted under
/docs/assets; the pages are FastAPI's own HTML pointed at them. Nothing on either page asks another host: the
Swagger validator badge is off, ReDoc's Google fonts are not linked, and a Content-Security-Policy keeps
anything else to the gateway.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS, REDOC, ASSETS = "/docs", "/redoc", "/docs/assets"
# The pages may load from the gateway alone, so a script that reaches for another host (ReDoc's footer logo is an
# image on cdn.redoc.ly) is stopped by the browser rather than left waiting on a machine without internet. The
# inline parts are FastAPI's page start-up script and the styles the two UIs set; search runs in a blob worker.
CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self'"
       " data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'none'")
_HIDE_REDOC_LOGO = '<style>a[href*="redocly.com"] img { display: none; }</style></head>'


def assets_dir() -> Path:
    """The installed fastapi-offline package's static folder. Raises RuntimeError when it is missing (the
    package is a dependency of jobgate's: an install without it is broken, and the docs would be blank)."""
    spec = find_spec("fastapi_offline")
    folder = Path(spec.origin).parent / "static" if spec and spec.origin else None
    if folder is None or not (folder / "swagger-ui-bundle.js").is_file():
        raise RuntimeError("the API docs' assets are missing: install jobgate's dependencies (fastapi-offline)")
    return folder


def install(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets on `app` (created with docs_url=None and redoc_url=None)."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")  # behind a proxy that strips a prefix

    @app.get(DOCS, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = base(request)
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png", oauth2_redirect_url=None,
            # The validator badge fetches an image from validator.swagger.io for every spec it is shown.
            swagger_ui_parameters={"validatorUrl": None})
        page.headers["Content-Security-Policy"] = CSP
        return page

    @app.get(REDOC, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = base(request)
        page = get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - API reference",
                              redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS}/favicon.png", with_google_fonts=False)
        html = bytes(page.body).decode().replace("</head>", _HIDE_REDOC_LOGO, 1)
        return HTMLResponse(html, headers={"Content-Security-Policy": CSP})
