"""``tokenmill serve``: the OpenAI-compatible Batches API, the job routes and the dashboard.

Its options become a ``ServiceSettings``; the server itself (FastAPI, the engine) is imported only
when the command runs, so a missing ``server`` extra is one line and exit status 6 (``cli.errors``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from cli.support import SPEC_EXIT, OldQueueOption, QueueOption, fail, setup_logging, use_broker


def serve(
    storage: Annotated[str, typer.Option("--storage", help="fsspec URL for uploaded files, results and metadata")],
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="the fleet's broker; none: jobs run in this process")
    ] = None,
    queue: QueueOption = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p")] = 8000,
    api_keys_file: Annotated[
        Path | None, typer.Option("--api-keys-file", help="one key per line, or TOML giving each key its "
                                   "own prefixes, variables and models (docs/tenants.md); also $TOKENMILL_API_KEYS")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="registered model name or local directory (default: the "
                                 "packaged default model)")
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="the name batch requests give as body.model")
    ] = None,
    engine_options: Annotated[
        str | None, typer.Option("--engine-options", help='JSON of more [model] fields, e.g. {"num_threads": 1}')
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="for requests that set none")] = 256,
    max_upload_mb: Annotated[float, typer.Option("--max-upload-mb")] = 200.0,
    allow_env: Annotated[
        list[str] | None, typer.Option("--allow-env", help="variables specs may reference as ${env:NAME} "
                                       "credentials, fnmatch patterns like 'AWS_*' (repeat; default none)")
    ] = None,
    allow_profile: Annotated[
        list[str] | None, typer.Option("--allow-profile", help="storage profiles specs may name (repeat)")
    ] = None,
    allowed_url_prefix: Annotated[
        list[str] | None, typer.Option("--allowed-url-prefix", help="confine /v1/jobs input and output URLs to "
                                       "these prefixes; needed for local paths (repeat)")
    ] = None,
    old_queue: OldQueueOption = None,
) -> None:
    """Serve the OpenAI Files/Batches API, /v1/jobs, /metrics and the dashboard at / (blocks)."""
    queue = queue or old_queue
    setup_logging()
    use_broker(broker)
    # lazy: FastAPI and the engine (seconds, and the optional 'server' extra); the model registry
    # loads huggingface_hub, which `tokenmill --help` does not need
    from engine.model_registry import DEFAULT_MODEL
    from service.app import serve as run_server
    from service.settings import ServiceSettings, SettingsError, load_keys

    try:
        keys, key_scopes, shared = load_keys(os.environ.get("TOKENMILL_API_KEYS"), api_keys_file)
        options = json.loads(engine_options) if engine_options else {}
        if not isinstance(options, dict):
            raise SettingsError("--engine-options: expected a JSON object")
    except (SettingsError, ValueError) as exc:
        fail(f"serve: {exc}", SPEC_EXIT)
    settings = ServiceSettings(
        storage_url=storage, api_keys=keys, broker_url=broker, queue=queue,
        redis_key_prefix=os.environ.get("TOKENMILL_REDIS_KEY_PREFIX"), model=model or DEFAULT_MODEL,
        served_model_name=served_model_name, engine_options=options, default_max_tokens=max_tokens,
        max_upload_bytes=int(max_upload_mb * 1024 * 1024), allowed_env=list(allow_env or []),
        allowed_profiles=list(allow_profile or []), allowed_url_prefixes=list(allowed_url_prefix or []),
        key_scopes=key_scopes, shared=shared,
    )
    typer.echo(f"tokenmill serve: http://{host}:{port}/ ({'fleet ' + broker if broker else 'embedded runner'}, "
               f"model {settings.model_name}, storage {storage})", err=True)
    run_server(settings, host, port)
