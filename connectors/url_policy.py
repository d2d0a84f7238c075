"""One normal form of a storage URL: the form its filesystem will open, checked and then opened.

A prefix check on the text a tenant sent is defeated by every spelling the filesystem reads
differently: ``http://h/pub/.%2e/private`` is ``/private`` to yarl (fsspec's HTTP filesystem
normalises with it), ``s3://a/../b`` is bucket ``b`` to a path-style endpoint that resolves dot
segments, ``file://x`` is a path relative to the working folder. ``normal_url`` reads a URL the
way the filesystem that will open it does, refuses what it cannot read unambiguously (a dot
segment in any percent-decoding, a backslash, a ``;`` parameter, userinfo, a chain ``a::b``),
and returns the form to check *and* to open, so the two never differ.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import yarl
from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem

ALIASES = {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "local": "file"}
HTTP = frozenset({"http", "https"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_AZURE_AUTHORITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9.-]*)?$")


class UrlRefused(ValueError):
    """A URL that cannot be read one way only; the message says why, after the URL."""


@dataclass(frozen=True)
class NormalURL:
    """A URL as its filesystem reads it: ``url`` is what to open, the rest is for comparisons."""

    protocol: str
    authority: str  # bucket, container or host:port; "" for local paths and memory://
    segments: tuple[str, ...]  # the decoded path, one entry per folder level
    url: str

    def within(self, other: NormalURL) -> bool:
        """True when this lies at or under ``other``, compared at folder boundaries."""
        if (self.protocol, self.authority) != (other.protocol, other.authority):
            return False
        return self.segments[: len(other.segments)] == other.segments


def normal_url(url: str) -> NormalURL:
    """The normal form of ``url`` (a local path, ``file://``, object store, ``http(s)://``...)."""
    if _CONTROL.search(url):
        raise UrlRefused(f"{url!r}: control characters in a URL")
    if "::" in url:
        raise UrlRefused(f"{url}: chained URLs ('::') open one filesystem through another")
    protocol, rest = split_protocol(url)
    protocol = ALIASES.get((protocol or "file").lower(), (protocol or "file").lower())
    if protocol == "file":
        return _local(url)
    if protocol in HTTP:
        return _http(url, protocol)
    return _keyed(protocol, rest)


def _decoded(text: str) -> str:
    """``text`` percent-decoded until it stops changing (a server may decode more than once)."""
    for _ in range(4):
        once = unquote(text)
        if once == text:
            return text
        text = once
    raise UrlRefused(f"{text}: percent-encoding nested too deep to read one way")


def _segments(path: str, url: str) -> tuple[str, ...]:
    """The path's folder levels, each decoded; refused when a decoding makes a dot segment, a
    slash, a backslash or a ``;`` parameter (servers read ``..;/``, ``%2f`` and ``\\`` as ``../`` and ``/``)."""
    parts = []
    for raw in path.split("/"):
        part = _decoded(raw)
        if part in (".", ".."):
            raise UrlRefused(f"{url}: '.' and '..' segments (in any encoding) are refused")
        if any(c in part for c in "/\\;") or _CONTROL.search(part):
            raise UrlRefused(f"{url}: encoded slashes, backslashes, ';' parameters and control characters "
                             "are refused")
        if part:
            parts.append(part)
    return tuple(parts)


def _local(url: str) -> NormalURL:
    """As fsspec's local filesystem opens it (no percent-decoding), links and ``..`` resolved."""
    path = os.path.realpath(os.path.expanduser(LocalFileSystem._strip_protocol(url)))
    return NormalURL("file", "", tuple(p for p in path.split("/") if p), path)


def _http(url: str, protocol: str) -> NormalURL:
    """As fsspec's HTTP filesystem opens it: ``yarl.URL(url)``, which decodes unreserved
    characters and resolves dot segments (``/pub/.%2e/x`` is ``/x``)."""
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError) as exc:
        raise UrlRefused(f"{url}: not a URL yarl reads ({exc})") from None
    if parsed.user is not None or parsed.password is not None or "@" in (parsed.raw_authority or ""):
        raise UrlRefused(f"{url}: userinfo ('user@') in an http URL")
    if not parsed.host or parsed.scheme != protocol:
        raise UrlRefused(f"{url}: no host")
    if "\\" in url or ";" in url.split("?", 1)[0]:
        raise UrlRefused(f"{url}: backslashes and ';' parameters are refused")
    _segments(url.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0].partition("/")[2], url)  # as sent
    segments = _segments(parsed.raw_path, url)  # as opened
    authority = f"{parsed.host.lower()}:{parsed.port}"
    return NormalURL(protocol, authority, segments, str(parsed))


def _keyed(protocol: str, rest: str) -> NormalURL:
    """Object stores (and memory://, ftp://...): keys are literal, but an S3-compatible endpoint
    addressed path-style puts the bucket in the path, where a proxy may resolve ``..``."""
    url = f"{protocol}://{rest}"
    if "?" in rest or "#" in rest:
        raise UrlRefused(f"{url}: '?' and '#' in an object-store URL (s3fs reads '?versionId=')")
    authority, _, path = rest.lstrip("/").partition("/") if protocol != "memory" else ("", "", rest)
    pattern = _AZURE_AUTHORITY if protocol in ("az", "abfs", "adl") else _BUCKET
    if protocol != "memory" and not pattern.match(authority):
        raise UrlRefused(f"{url}: {authority!r} is not a bucket name (no userinfo, port or encoding)")
    segments = _segments(path, url)
    body = "/".join(segments)
    opened = f"{protocol}://{authority}/{body}" if protocol != "memory" else f"memory:///{body}"
    return NormalURL(protocol, authority.lower() if protocol in ("az", "abfs", "adl") else authority, segments,
                     opened)


def stays_under(url: str, root: str) -> bool:
    """True when ``url`` lies under ``root`` once both are normal. An HTTP "listing" is the links
    of a page, which may point anywhere (``../private/x``, ``/private/x``): those are not files
    of the folder listed."""
    try:
        return normal_url(url).within(normal_url(root))
    except UrlRefused:
        return False


REDIRECTS_OPTION = "redirects"  # a storage option of tokenmill's own, popped before fsspec sees it
WITHIN_URL = "within_url"


def confine_redirects(options: dict[str, Any]) -> dict[str, Any]:
    """HTTP options in which a redirect is followed only to a URL under the one requested
    (``/pub`` to ``/pub/`` is; ``/pub/x`` to ``/private/x`` is an error naming the target), checked
    before the redirect is followed. Applied where ``redirects = "within_url"`` (the service puts
    it in every spec it accepts); other options are returned as they are, without it."""
    options = dict(options)
    if options.pop(REDIRECTS_OPTION, None) != WITHIN_URL:
        return options
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(_check_redirect)
    client_kwargs = dict(options.get("client_kwargs") or {})
    client_kwargs["trace_configs"] = [*client_kwargs.get("trace_configs", []), trace]
    return {**options, "client_kwargs": client_kwargs}


async def _check_redirect(session: Any, context: Any, params: Any) -> None:
    import aiohttp

    location = params.response.headers.get("Location", "")
    target = str(params.url.join(yarl.URL(location))) if location else ""
    if not target or not stays_under(target, str(params.url)):
        raise aiohttp.ClientResponseError(
            params.response.request_info, (), status=params.response.status,
            message=f"redirect to {location or '?'} not followed: it leaves {params.url}")
