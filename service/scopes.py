"""What each key of ``tokenmill serve`` may reach: the operator's keys file, one scope per key.

A keys file is either the old form (one key per line, ``#`` comments; every key gets the
server-wide flags) or TOML, recognised by its first table header::

    [shared]                      # every key: read-only unless listed under write
    read = ["s3://datasets/public/"]
    write = []
    models = []

    [[keys]]
    name = "team-a"
    key_env = "TEAM_A_KEY"        # or key = "..." in the file itself
    read = ["s3://team-a/in/"]
    write = ["s3://team-a/out/"]  # write implies read
    allow_env = ["TEAM_A_*"]      # ${env:NAME} credentials its specs may use
    allow_profile = []
    models = ["gemma3-270m"]  # names or local folders it may load, besides --model
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SharedScope(_Strict):
    """Prefixes every key may use; explicit, and read-only unless under ``write``."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


class KeyScope(_Strict):
    """One key's own reach, besides what is shared."""

    name: str = Field(min_length=1)
    key: str | None = Field(None, repr=False)
    key_env: str | None = None
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    allow_env: tuple[str, ...] = ()
    allow_profile: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_key(self) -> KeyScope:
        if (self.key is None) == (self.key_env is None):
            raise ValueError("give exactly one of key and key_env")
        return self

    def secret(self) -> str:
        if self.key is not None:
            return self.key
        value = os.environ.get(str(self.key_env), "").strip()
        if not value:
            raise ValueError(f"key_env {self.key_env} is not set")
        return value


class KeysFile(_Strict):
    shared: SharedScope = SharedScope()
    keys: tuple[KeyScope, ...] = ()


def is_toml(text: str) -> bool:
    """The first line that is neither blank nor a comment opens a table: the scoped form."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith("[")
    return False


class ParsedKeys(NamedTuple):
    """A scoped keys file: the file (its shared scope) and each key's scope."""

    file: KeysFile
    scopes: dict[str, KeyScope]  # key -> its scope


def parse_keys_file(text: str, where: Path) -> ParsedKeys:
    """The file's shared scope and ``{key: its scope}``; a ValueError naming what is wrong."""
    try:
        parsed = KeysFile.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not TOML ({exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{where}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    scopes: dict[str, KeyScope] = {}
    for entry in parsed.keys:
        try:
            secret = entry.secret()
        except ValueError as exc:
            raise ValueError(f"{where}: keys {entry.name!r}: {exc}") from None
        if secret in scopes:
            raise ValueError(f"{where}: keys {entry.name!r}: the same key as {scopes[secret].name!r}")
        scopes[secret] = entry
    return ParsedKeys(parsed, scopes)
