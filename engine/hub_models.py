"""A model named by its Hugging Face Hub id (``org/name``, optionally a revision) resolved to a
snapshot folder through ``huggingface_hub``, so its cache, ``HF_HOME``/``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``, ``HF_TOKEN`` and ``local_files_only`` mean what they mean everywhere else.

Only what the engine reads is fetched: configs, safetensors weights and tokenizer files.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.model_errors import ModelNotFound

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
ENGINE_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


def is_hub_id(text: str) -> bool:
    """``org/name`` as the Hub spells repository ids (no scheme, no third path part)."""
    return bool(HUB_ID.match(text)) and ".." not in text


def hub_snapshot(repo_id: str, revision: str | None = None, *, local_files_only: bool = False) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` (default ``main``), downloaded into the
    Hub cache if it is not there and the Hub may be reached; ``ModelNotFound`` in one line if not."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=ENGINE_FILES,
                                   local_files_only=local_files_only)
    except LocalEntryNotFoundError:
        offline = "local_files_only" if local_files_only else (
            "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "the Hub unreachable")
        raise ModelNotFound(f"model {where} is not in the Hugging Face cache {constants.HF_HUB_CACHE} "
                            f"({offline})") from None
    except GatedRepoError:
        raise ModelNotFound(f"model {where} is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise ModelNotFound(f"model {where}: no such revision on the Hub") from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"model {where}: no such repository on the Hub (or it is private: "
                            "set HF_TOKEN)") from None
    except HfHubHTTPError as exc:
        raise ModelNotFound(f"model {where}: {str(exc).splitlines()[0]}") from None
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model {where} has no config.json (not a transformers checkpoint)")
    return path
