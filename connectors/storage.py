"""Filesystem resolution, URL joining, storage errors and retries.

Everything else in `connectors` reaches storage through `filesystem_for`, so the
choice of backend (local, S3, GCS, memory) and its credentials live in exactly
one place and come from the caller's `storage_options`, never from code.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import fsspec
from fsspec.core import url_to_fs

from connectors.credentials import CredentialError, remember_literals, resolve_references
from connectors.redaction import redact
from connectors.url_policy import HTTP, confine_redirects

log = logging.getLogger(__name__)

T = TypeVar("T")

S3_ENDPOINT_ENV = "TOKENMILL_S3_ENDPOINT_URL"
_S3_PROTOCOLS = ("s3", "s3a")
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


def public_url(url: str) -> str:
    """The URL (or any text holding URLs) without the ``user:password@`` part of each."""
    return _USERINFO.sub(r"\1", url)


def has_userinfo(url: str) -> bool:
    return public_url(url) != url


class StorageError(Exception):
    """A storage object is missing, unreadable or denied; the message names the URL."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(redact(message))  # storage libraries echo the options they were given
        self.url = url


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


class Located(NamedTuple):
    """Where a URL lives: its fsspec filesystem, and its path on it."""

    fs: fsspec.AbstractFileSystem
    path: str


def filesystem_for(url: str, storage_options: dict | None = None) -> Located:
    """fsspec filesystem + path for a URL or plain local path.

    `storage_options` go to the filesystem with their ``${env:NAME}`` references resolved
    from this process's environment (see ``connectors.credentials``). For S3 only, an endpoint
    from $TOKENMILL_S3_ENDPOINT_URL is filled in when the caller gave none, so a
    fleet can be pointed at MinIO/moto without touching job specs.
    """
    remember_literals(storage_options or {})
    try:
        options: dict[str, Any] = resolve_references(dict(storage_options or {}))
    except CredentialError as exc:
        raise StorageError(f"cannot open storage for {public_url(url)}: {exc}", url) from exc
    if _protocol(url) in _S3_PROTOCOLS:
        endpoint = os.environ.get(S3_ENDPOINT_ENV)
        client_kwargs = dict(options.get("client_kwargs") or {})
        if endpoint and not options.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
            client_kwargs["endpoint_url"] = endpoint
            options["client_kwargs"] = client_kwargs
    if _protocol(url) in HTTP:
        options = confine_redirects(options)
    try:
        fs, path = url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise StorageError(f"cannot open storage for {url}: {exc}", url) from exc
    return Located(fs, path)


def join_url(base: str, name: str) -> str:
    """`base` + "/" + `name` as a plain string, so the protocol and host survive."""
    name = name.lstrip("/")
    if base.endswith("://"):
        return base + name
    return base.rstrip("/") + "/" + name


# --- retries -----------------------------------------------------------------

# OSError errnos that describe the request, not the network: retrying cannot help.
_PERMANENT_ERRNOS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EEXIST,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.EINVAL,
    errno.ENOSYS,
    errno.ENAMETOOLONG,
    errno.ENOTEMPTY,
    errno.EROFS,
    errno.ENOSPC,
    errno.EMSGSIZE,
    getattr(errno, "EREMCHG", errno.ENOENT),
}
_PERMANENT_TYPES: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    PermissionError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
)
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable"}


def _client_error_is_transient(exc: BaseException) -> bool | None:
    """Classify a botocore ClientError by HTTP status / code; None if `exc` is not one."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict) or "Error" not in response:
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    code = str(response["Error"].get("Code", ""))
    return status >= 500 or code in _THROTTLE_CODES or (code.isdigit() and int(code) >= 500)


def _network_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from botocore import exceptions as bce

        types += [bce.ConnectionError, bce.HTTPClientError]
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    try:
        import aiohttp

        types.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


_NETWORK_TYPES = _network_error_types()


def is_transient(exc: BaseException) -> bool:
    """True if retrying the same operation later may succeed (network, timeout, 5xx, throttling)."""
    if isinstance(exc, (StorageError, *_PERMANENT_TYPES)):
        return False
    client = _client_error_is_transient(exc)
    if client is not None:
        return client
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int) and status < 500:
        return False
    if isinstance(exc, _NETWORK_TYPES):
        return True
    if isinstance(exc, OSError):
        # s3fs turns S3 errors into OSErrors with the ClientError as __cause__.
        cause = _client_error_is_transient(exc.__cause__) if exc.__cause__ else None
        if cause is not None:
            return cause
        # An OSError with no errno and no network cause is a verdict on the data, not the
        # link: pyarrow's "Couldn't deserialize thrift" for a corrupt footer is one.
        return exc.errno is not None and exc.errno not in _PERMANENT_ERRNOS
    return False


def with_retries(fn: Callable[[], T], *, attempts: int = 5, base_delay: float = 0.2, what: str) -> T:
    """Call `fn`, retrying transient storage errors with jittered exponential backoff.

    Permanent errors (missing object, access denied, bad request) and the last
    transient error are re-raised unchanged so callers can map them.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            delay = base_delay * (2 ** (attempt - 1)) * (1 + random.random() / 4)
            log.warning(
                "%s failed (attempt %d/%d, retrying in %.2fs): %s: %s",
                what,
                attempt,
                attempts,
                delay,
                type(exc).__name__,
                exc,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
