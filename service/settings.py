"""What ``tokenmill serve`` was started with."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from engine.model_registry import DEFAULT_MODEL
from service.scopes import KeyScope, SharedScope, is_toml, parse_keys_file
from service.spec_policy import SpecPolicy

DEFAULT_MAX_UPLOAD_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch input file
DEFAULT_MAX_JSON_BYTES = 1024 * 1024  # any other request body
DEFAULT_MAX_BATCH_LINES = 50_000  # requests in one batch input file, as OpenAI's


class SettingsError(ValueError):
    """A bad option for ``tokenmill serve`` (the CLI prints it and exits 2)."""


def key_id(api_key: str) -> str:
    """The owner id stored with a key's objects: a hash, so metadata never holds the key."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


def load_api_keys(env_value: str | None, keys_file: Path | None) -> list[str]:
    """Keys from $TOKENMILL_API_KEYS (comma-separated) and a file (one per line, '#' comments)."""
    return load_keys(env_value, keys_file).keys


class ApiKeys(NamedTuple):
    """The service's keys, the scopes a TOML keys file gives some of them (``service.scopes``)
    and its shared scope."""

    keys: list[str]
    scopes: dict[str, KeyScope]
    shared: SharedScope


def load_keys(env_value: str | None, keys_file: Path | None) -> ApiKeys:
    """Keys from $TOKENMILL_API_KEYS and ``keys_file`` (plain lines or a scoped TOML file)."""
    keys = [k.strip() for k in (env_value or "").split(",") if k.strip()]
    scopes: dict[str, KeyScope] = {}
    shared = SharedScope()
    if keys_file is not None:
        try:
            text = keys_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"--api-keys-file {keys_file}: {exc.strerror or exc}") from None
        if is_toml(text):
            try:
                parsed = parse_keys_file(text, keys_file)
            except ValueError as exc:
                raise SettingsError(f"--api-keys-file {exc}") from None
            shared, scopes = parsed.file.shared, parsed.scopes
            keys += list(scopes)
        else:
            lines = text.splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise SettingsError("no API keys: set TOKENMILL_API_KEYS (comma-separated) or give --api-keys-file")
    return ApiKeys(keys, scopes, shared)


@dataclass
class ServiceSettings:
    storage_url: str  # files, results and the service's metadata live here (fsspec URL)
    api_keys: list[str]
    broker_url: str | None = None  # None: jobs run in the server process (embedded runner)
    queue: str | None = None
    redis_key_prefix: str | None = None
    model: str = DEFAULT_MODEL  # registered name or local directory
    served_model_name: str | None = None  # the name requests give in body.model
    engine_options: dict[str, Any] = field(default_factory=dict)  # more [model] fields of the batch jobs
    default_max_tokens: int = 256
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    storage_options: dict[str, Any] = field(default_factory=dict)
    poll_s: float = 0.5  # how often the batch advancer looks at running batches
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_batch_lines: int = DEFAULT_MAX_BATCH_LINES
    # What a spec posted to /v1/jobs may reach (service.spec_policy): nothing of the server's by default.
    allowed_env: list[str] = field(default_factory=list)  # fnmatch patterns of variable names
    allowed_profiles: list[str] = field(default_factory=list)
    allowed_url_prefixes: list[str] = field(default_factory=list)  # every key reads and writes there
    key_scopes: dict[str, KeyScope] = field(default_factory=dict)  # {key: its own reach} (a TOML keys file)
    shared: SharedScope = field(default_factory=SharedScope)  # every key's, read-only unless under write

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name

    @property
    def owners(self) -> dict[str, str]:
        return {key: key_id(key) for key in self.api_keys}

    def spec_policy(self) -> SpecPolicy:
        return SpecPolicy(self.storage_url, tuple(self.allowed_env), tuple(self.allowed_profiles),
                          tuple(self.allowed_url_prefixes), self.model, tuple(self.engine_options.items()),
                          self.shared, {key_id(k): scope for k, scope in self.key_scopes.items()})

    def model_section(self) -> dict[str, Any]:
        """The ``[model]`` table of the job specs the server builds for batches."""
        is_path = os.sep in self.model or Path(self.model).is_dir()
        section: dict[str, Any] = {"path": self.model} if is_path else {"name": self.model}
        return {**section, **self.engine_options}
