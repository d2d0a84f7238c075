"""Credentials inside ``storage_options``: wrapped in SecretStr so no repr, log or dump shows them.

Specs are printed (errors, ``repr``, debug logs) far more often than anyone thinks about
what they contain, so secrecy is decided by key name when the spec is loaded, not by
each caller remembering to redact.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from connectors.credentials import is_sensitive


def protect(value: Any, name: str = "") -> Any:
    """A copy with every string under a sensitive key (at any depth) wrapped in SecretStr."""
    if isinstance(value, dict):
        return {k: protect(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [protect(v, name) for v in value]
    if isinstance(value, str) and is_sensitive(name):
        return SecretStr(value)
    return value


def reveal(value: Any) -> Any:
    """The plain values again: only for handing options to a filesystem or a worker."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v) for v in value]
    return value
