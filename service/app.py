"""The FastAPI application of ``tokenmill serve`` and its start-up."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from connectors.redaction import redact
from pipeline.engine_share import EngineShare
from service import metrics
from service.auth import owner_of
from service.batches import BatchAdvancer
from service.errors import install_handlers
from service.guard import RequestGuard
from service.live_engine import LiveEngine, engine_settings
from service.output_owners import OutputOwners
from service.records import Store
from service.routes_batches import router as batches_router
from service.routes_completions import router as completions_router
from service.routes_embeddings import router as embeddings_router
from service.routes_files import router as files_router
from service.routes_jobs import router as jobs_router
from service.runners import EmbeddedRunner, FleetRunner, Runner
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
STATIC = files("service") / "static"


def make_runner(settings: ServiceSettings, engines: EngineShare | None = None) -> Runner:
    """The fleet, or jobs on a thread of this process sharing ``engines`` with the live routes."""
    if settings.broker_url:
        return FleetRunner(settings.broker_url, settings.queue, settings.redis_key_prefix)
    return EmbeddedRunner(engines=engines)


def create_app(settings: ServiceSettings, runner: Runner | None = None, *, load_model: bool = False) -> FastAPI:
    """With ``load_model`` the live engine is built and warmed at start-up (``/readyz`` then turns
    200); otherwise on the first completion (the in-process tests' apps)."""
    store = Store(settings.storage_url, settings.storage_options)
    live_settings = engine_settings(settings.model, settings.engine_options)
    engines = EngineShare(live_settings)  # one model in memory: the live routes' and the embedded jobs'
    runner = runner or make_runner(settings, engines)
    advancer = BatchAdvancer(store, runner, settings)
    live = LiveEngine(live_settings, settings.model_name, engines=engines)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        advancer.start()
        if load_model:
            live.start()
        yield
        advancer.stop()

    app = FastAPI(title="tokenmill", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")  # behind a key, as every route but the keyless ones
    app.state.settings, app.state.store, app.state.runner = settings, store, runner
    app.state.spec_policy = settings.spec_policy()
    app.state.output_owners = OutputOwners(settings.storage_url, settings.storage_options)
    app.state.live_engine = live
    install_handlers(app)
    metrics.install(store)
    app.include_router(files_router)
    app.include_router(batches_router)
    app.include_router(jobs_router)
    app.include_router(completions_router)
    app.include_router(embeddings_router)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    app.add_middleware(RequestGuard, settings=settings)  # the key and the body limit, before any body

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "mode": "fleet" if settings.broker_url else "embedded",
                "model": settings.model_name}

    @app.get("/readyz")
    @app.get("/health", include_in_schema=False)  # vllm serve's name for the same answer
    def readyz() -> Response:
        """200 once the live engine is built and warmed; 503 (with the reason if loading failed) before."""
        if live.ready:
            return JSONResponse({"status": "ready", "model": settings.model_name})
        body = {"status": "failed" if live.load_error else "loading", "model": settings.model_name}
        return JSONResponse({**body, **({"error": redact(live.load_error)} if live.load_error else {})},
                            status_code=503)

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        """The page itself is public; it asks for a key and sends it with every JSON call."""
        return FileResponse(str(STATIC / "index.html"), media_type="text/html")

    @app.get("/v1/models")
    def models(request: Request) -> dict[str, Any]:
        owner_of(request)
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "tokenmill"}]}

    return app


def serve(settings: ServiceSettings, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(create_app(settings, load_model=True), host=host, port=port, log_level="warning")
