"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) for every app ``ctxkit serve`` builds, from
scripts and styles the server itself serves.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without internet
access (where a model server often runs) they are blank. The ``fastapi-offline`` package (in
the ``serve`` extra; MIT, as are Swagger UI (Apache-2.0) and ReDoc (MIT) it bundles) ships
``swagger-ui-bundle.js``, ``swagger-ui.css`` and ``redoc.standalone.js``; they are served
under :data:`ASSETS`, and both pages name only paths of this server.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' ``request: Request``
# (imported inside add_docs) from the annotations at run time.
from importlib.util import find_spec
from pathlib import Path

from ..core.deps import require

__all__ = ["ASSETS", "DOC_ENDPOINTS", "add_docs", "assets_folder"]

ASSETS = "/docs-assets"  # where the scripts, the stylesheet and the icon are served
DOC_ENDPOINTS = ["GET /docs", "GET /redoc"]


def assets_folder() -> Path:
    """The folder of fastapi-offline's copies of the Swagger UI and ReDoc files (found
    without importing the package, which would import FastAPI)."""
    spec = find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        require("fastapi_offline", "ctxkit serve's /docs and /redoc")  # the one-line "install the serve extra"
    return Path(spec.origin).parent / "static"


def add_docs(app) -> None:
    """Add ``/docs``, ``/redoc`` and their files to a FastAPI ``app`` built with
    ``docs_url=None, redoc_url=None`` (FastAPI's CDN pages off); both read ``app.openapi_url``.

    Paths are prefixed with the ASGI ``root_path``, so the pages work behind a proxy that
    mounts the server under a prefix.
    """
    from fastapi import Request  # lazy: the serve extra
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount(ASSETS, StaticFiles(directory=str(assets_folder())), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request):
        root = request.scope.get("root_path", "")
        # validatorUrl null: Swagger UI would otherwise send the schema to validator.swagger.io.
        return get_swagger_ui_html(openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS}/swagger-ui.css", swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": True})

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request):
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
                              with_google_fonts=False)  # Google's fonts: another host
