"""Credentials in storage options: named where storage is opened, never carried in a message.

A storage option may be a reference, resolved by the process that opens the storage
(``filesystem_for``): ``"${env:NAME}"`` is ``$NAME`` in that process's own environment
(a worker's, not the submitter's). s3fs's own ``profile`` option names a profile in the
worker's ``~/.aws`` files. A literal value under a credential key name works for a run in
this process, but ``literal_credentials`` finds it so that nothing sends it to a fleet.
"""

from __future__ import annotations

import os
import re
from typing import Any

from connectors.redaction import remember

# Key names that hold credentials in fsspec/s3fs/gcsfs/adlfs options (substring match).
_SENSITIVE = ("key", "secret", "token", "password", "passwd", "credential", "session", "sas", "auth", "signature")
_ENV_REF = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")


class CredentialError(ValueError):
    """A credential would leave this process (or a reference to one cannot be resolved)."""


def is_sensitive(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE)


def env_reference(value: Any) -> str | None:
    """The variable name of a ``"${env:NAME}"`` reference, else None."""
    match = _ENV_REF.match(value) if isinstance(value, str) else None
    return match.group(1) if match else None


def resolve_references(options: Any, where: str = "storage_options", key: str = "") -> Any:
    """A copy with every ``"${env:NAME}"`` replaced by ``$NAME`` from this process's environment.
    A value resolved under a credential option name is remembered for redaction (values under
    other options, an endpoint or ``auto_mkdir = "${env:HOME}"``, are not secrets, and cutting
    a home folder out of every later message would garble them)."""
    if isinstance(options, dict):
        return {k: resolve_references(v, f"{where}.{k}", str(k)) for k, v in options.items()}
    if isinstance(options, list):
        return [resolve_references(v, f"{where}[{i}]", key) for i, v in enumerate(options)]
    name = env_reference(options)
    if name is None:
        return options
    value = os.environ.get(name)
    if value is None:
        raise CredentialError(f"{where} refers to ${{env:{name}}}, which is not set in this process's environment")
    if is_sensitive(key):
        remember(value, name)  # whatever reads it back from here on sees the reference, not the value
    return value


def remember_literals(options: Any, name: str = "") -> None:
    """Redact from now on the literal credentials in ``options`` (strings under credential key names)."""
    if isinstance(options, dict):
        for key, value in options.items():
            remember_literals(value, str(key))
    elif isinstance(options, list):
        for value in options:
            remember_literals(value, name)
    elif isinstance(options, str) and is_sensitive(name) and env_reference(options) is None:
        remember(options, "")


def literal_credentials(options: Any, where: str = "storage_options") -> list[str]:
    """Paths of credential-named options holding a literal value (not a reference)."""
    found: list[str] = []
    if isinstance(options, dict):
        for key, value in options.items():
            path = f"{where}.{key}"
            if isinstance(value, (dict, list)):
                found += literal_credentials(value, path)
            elif isinstance(value, str) and value and is_sensitive(str(key)) and env_reference(value) is None:
                found.append(path)
    elif isinstance(options, list):
        for i, value in enumerate(options):
            found += literal_credentials(value, f"{where}[{i}]")
    return found
