"""What a spec posted to ``/v1/jobs`` may reach: the operator's rules, checked before anything runs.

A key holder is a tenant, not an administrator. The server and its workers hold credentials
(environment variables, ``~/.aws`` profiles, ambient cloud roles) and the service's own
storage holds every team's files; a spec sent over HTTP may use those only as the operator
allows with ``--allow-env``, ``--allow-profile`` and ``--allowed-url-prefix``:

- a ``${env:NAME}`` reference must name a variable matching an ``--allow-env`` pattern, sit
  under a credential option (``key``, ``secret``, ``token``...), and the storage it opens
  must be an object store at its default endpoint: a spec never picks where a server
  credential is sent, nor an option that a library echoes back;
- ``profile`` must be one of ``--allow-profile``;
- ``[model]`` engine settings (memory, threads, batch sizes) are absent or equal to the
  server's ``--engine-options``;
- input and output URLs (and local files the spec reads) never lie inside the server's
  ``--storage`` nor contain it; with ``--allowed-url-prefix`` they must lie under one of
  those prefixes; without, only object-store URLs (s3, gs, az...) are accepted: local paths,
  ``file://``, ``memory://``, ``http(s)://`` (the cloud metadata endpoint is one) are refused.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from connectors.backends import backend_for
from connectors.credentials import env_reference, is_sensitive
from connectors.url_policy import HTTP, REDIRECTS_OPTION, WITHIN_URL, UrlRefused, normal_url
from engine.model_registry import DEFAULT_MODEL
from jobs.secrets import reveal
from jobs.spec import JobSpec
from service.errors import bad_request
from service.scopes import KeyScope, SharedScope

OBJECT_STORES = frozenset({"s3", "gs", "az", "abfs", "adl"})
_ENDPOINT_KEYS = frozenset({"endpoint_url", "endpoint", "host", "url", "account_url", "connection_string", "proxies",
                            "proxy", "proxy_url"})
_GLOB = re.compile(r"[*?\[{]")


def _literal_prefix(url: str) -> tuple[str, str]:
    """(the part of a glob URL before its first wildcard, cut back to a folder; the pattern)."""
    match = _GLOB.search(url)
    if match is None:
        return url, ""
    head, _, tail = url[: match.start()].rpartition("/")
    return head, tail + url[match.start():]


def literal_prefix(url: str) -> str:
    """A (glob) URL's folder before its first wildcard: what a listing of it can reach."""
    return _literal_prefix(url)[0]


def _pattern_problem(pattern: str) -> str | None:
    parts = pattern.split("/")
    if any(p in (".", "..") or "%" in p or "\\" in p for p in parts):
        return "a glob may not hold '.' or '..' segments, '%' or backslashes"
    return None


def _walk(options: Any, where: str, key: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, key, value) of every leaf of a storage-options tree."""
    if isinstance(options, dict):
        for k, v in options.items():
            yield from _walk(v, f"{where}.{k}", str(k))
    elif isinstance(options, list):
        for i, v in enumerate(options):
            yield from _walk(v, f"{where}[{i}]", key)
    else:
        yield where, key, options


@dataclass(frozen=True)
class Reach:
    """What one key's specs may use: the server-wide flags, the shared scope and its own."""

    read: tuple[str, ...]  # prefixes it may read (those it may write included)
    write: tuple[str, ...]
    env: tuple[str, ...]
    profiles: tuple[str, ...]
    models: tuple[str, ...]  # besides the server's --model


@dataclass(frozen=True)
class SpecPolicy:
    storage_url: str
    allowed_env: tuple[str, ...] = ()
    allowed_profiles: tuple[str, ...] = ()
    allowed_url_prefixes: tuple[str, ...] = ()  # every key's, to read and write (the flag's old meaning)
    server_model: str = ""
    engine_options: tuple[tuple[str, Any], ...] = ()  # the server's --engine-options
    shared: SharedScope = field(default_factory=SharedScope)
    scopes: dict[str, KeyScope] = field(default_factory=dict)  # by owner id (the key's hash)

    def reach(self, owner: str | None) -> Reach:
        scope = self.scopes.get(owner or "")
        own = scope or KeyScope(name="-", key="-")
        write = (*self.allowed_url_prefixes, *self.shared.write, *own.write)
        return Reach((*write, *self.shared.read, *own.read), write, (*self.allowed_env, *own.allow_env),
                     (*self.allowed_profiles, *own.allow_profile), (*self.shared.models, *own.models))

    def check(self, spec: JobSpec, owner: str | None = None) -> JobSpec:
        """The spec with every URL in the normal form its filesystem opens, or a 400 naming the
        first field that reaches beyond what the operator allows this key. Check and open see one URL."""
        reach = self.reach(owner)
        data = spec.to_data()
        data["input"]["url"] = self._check_url(spec.input.full_url, "input.url", reach.read)
        data["input"].pop("glob", None)
        data["output"]["url"] = self._check_url(spec.output.url, "output.url", reach.write, reach.read)
        if spec.extract is not None and spec.extract.schema_file:
            data["extract"]["schema_file"] = self._check_url(spec.extract.schema_file, "extract.schema_file",
                                                             reach.read)
        data["model"] = {**data.get("model", {}), **self._check_model(spec, reach)}
        self._check_engine(spec.model.model_dump(exclude={"name", "path"}, exclude_none=True))
        self._check_options(reveal(spec.input.storage_options), "input.storage_options", spec.input.full_url, reach)
        if spec.output.storage_options is not None:
            self._check_options(reveal(spec.output.storage_options), "output.storage_options", spec.output.url,
                                reach)
        elif spec.input.storage_options:
            self._check_options(reveal(spec.input.storage_options), "input.storage_options", spec.output.url, reach)
        if _protocol_of(data["input"]["url"]) in HTTP:
            # a redirect is the web server's choice of URL, not a checked one: only those under it
            data["output"].setdefault("storage_options", dict(data["input"].get("storage_options") or {}))
            data["input"]["storage_options"] = {**(data["input"].get("storage_options") or {}),
                                                REDIRECTS_OPTION: WITHIN_URL}
        return JobSpec.from_dict(data)

    def _check_model(self, spec: JobSpec, reach: Reach) -> dict[str, str]:
        """The model the job loads: the server's (when the spec names none), or one the operator
        listed for this key. A tenant never makes the server download or load another."""
        server = self.server_model or DEFAULT_MODEL
        server_field = "path" if (os.sep in server or os.path.isdir(server)) else "name"
        asked = spec.model.path or spec.model.name
        if asked is None:
            return {server_field: server}
        if _same_model(asked, server) or any(_same_model(asked, m) for m in reach.models):
            return {"path": normal_url(asked).url} if spec.model.path else {}
        param = "model.path" if spec.model.path else "model.name"
        raise bad_request(f"{param}: {asked} is not a model this server lets this key load (its own, "
                          f"{server}, or one the operator lists for the key)", param, "model_not_allowed")

    def _check_url(self, url: str, param: str, prefixes: tuple[str, ...], any_prefix: tuple[str, ...] = ()) -> str:
        """The normal form of ``url`` (a glob keeps its pattern after the normal literal part)."""
        literal, pattern = _literal_prefix(url)
        problem = _pattern_problem(pattern)
        if problem:
            raise bad_request(f"{param}: {url}: {problem}", param, "url_not_allowed")
        try:
            where = normal_url(literal)
        except UrlRefused as exc:
            raise bad_request(f"{param}: {exc}", param, "url_not_allowed") from None
        backend = backend_for(where.protocol)
        if backend is None or not backend.over_http:
            why = backend.why if backend else "a protocol this server's policy does not know"
            raise bad_request(f"{param}: {where.protocol}:// is not opened for specs sent over HTTP ({why})", param,
                              "url_not_allowed")
        storage = normal_url(self.storage_url)
        if where.within(storage) or storage.within(where):
            raise bad_request(f"{param}: {url} overlaps the service's own storage, which jobs may not read or "
                              "write", param, "url_not_allowed")
        if prefixes or any_prefix:
            if not any(where.within(normal_url(prefix)) for prefix in prefixes):
                raise bad_request(f"{param}: {url} is outside the prefixes this key may "
                                  f"{'write' if param == 'output.url' else 'read'} "
                                  f"({', '.join(prefixes) or 'none'})", param, "url_not_allowed")
        elif where.protocol not in OBJECT_STORES:
            raise bad_request(f"{param}: {where.protocol} URLs and local paths are refused over HTTP unless the "
                              "server allows them with --allowed-url-prefix", param, "url_not_allowed")
        if not pattern:
            return where.url + ("/" if url.endswith("/") and not where.url.endswith("/") else "")
        return where.url.rstrip("/") + "/" + pattern

    def _check_engine(self, settings: dict[str, Any]) -> None:
        """Engine settings size a worker's memory and threads: the operator's, not a team's
        (``kv_cache_memory_gb = 1000`` would kill every worker the job reached)."""
        allowed = dict(self.engine_options)
        for key, value in settings.items():
            if key not in allowed or allowed[key] != value:
                shown = f"{allowed[key]!r}" if key in allowed else "not set"
                raise bad_request(f"model.{key}: engine settings are the operator's (--engine-options; here "
                                  f"{shown}); leave it out or give the same value", f"model.{key}",
                                  "setting_not_allowed")

    def _check_options(self, options: dict[str, Any], where: str, url: str, reach: Reach) -> None:
        leaves = list(_walk(options, where))
        references = [(path, key, env_reference(v)) for path, key, v in leaves if env_reference(v) is not None]
        for path, key, value in leaves:
            if key == "profile" and value not in reach.profiles:
                raise bad_request(f"{path}: profile {value!r} is not one this server allows (--allow-profile)",
                                  path, "credential_not_allowed")
        for path, key, name in references:
            if not any(fnmatch.fnmatchcase(str(name), pattern) for pattern in reach.env):
                raise bad_request(f"{path}: ${{env:{name}}} is not a variable this server lets specs use "
                                  "(--allow-env)", path, "credential_not_allowed")
            if not is_sensitive(key) or key == "profile":
                raise bad_request(f"{path}: a ${{env:...}} reference may only be the value of a credential "
                                  "option (key, secret, token...)", path, "credential_not_allowed")
        if references:
            backend = backend_for(_protocol_of(url))
            chosen = (backend.endpoint_options | {"headers"}) if backend else frozenset()
            endpoints = [path for path, _, _ in leaves if path.removeprefix(where + ".") in chosen
                         or {*re.split(r"[.\[]", path)} & (_ENDPOINT_KEYS | {"headers"})]
            if endpoints or _protocol_of(url) not in OBJECT_STORES:
                path = endpoints[0] if endpoints else where
                raise bad_request(f"{path}: a spec that uses the server's credentials may not choose where "
                                  "they are sent: no endpoint, proxy or headers, object-store URLs only", path,
                                  "credential_not_allowed")


def _same_model(asked: str, listed: str) -> bool:
    """Names compare as they are; folders by their normal (real) path."""
    if asked == listed:
        return True
    if os.sep in asked or os.sep in listed:
        try:
            return normal_url(asked) == normal_url(listed)
        except UrlRefused:
            return False
    return False


def _protocol_of(url: str) -> str:
    try:
        return normal_url(_literal_prefix(url)[0]).protocol
    except UrlRefused:
        return "?"
