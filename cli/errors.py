"""Every failure a user can cause from the ``tokenmill`` command as one line on stderr and an
exit code of its own; ``tokenmill --debug`` (or ``TOKENMILL_DEBUG=1``) shows the traceback.

The commands raise what they raise; ``TokenmillApp`` maps the exception once, at the top, so a
command never grows its own try/except ladder. Exit codes (docs/jobs.md, "Exit codes"):

    0  done                          1  the job failed, or an unexpected error
    2  spec or usage error           3  broker / job-state Redis unreachable
    4  model not found or not runnable (architecture, quantization)
    5  storage unreachable           6  an optional extra is not installed
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import typer

from engine.model_errors import ModelError

FAILED_EXIT = 1
SPEC_EXIT = 2
BROKER_EXIT = 3
MODEL_EXIT = 4
STORAGE_EXIT = 5
EXTRA_EXIT = 6

# A missing top-level module -> the extra that installs it (pyproject.toml's optional-dependencies).
EXTRA_OF_MODULE = {
    "fastapi": "server", "uvicorn": "server", "multipart": "server", "python_multipart": "server",
    "matplotlib": "plots", "lm_eval": "eval", "triton": "triton",
}


def debug_enabled() -> bool:
    return os.environ.get("TOKENMILL_DEBUG", "").lower() not in ("", "0", "false", "no")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_broker_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    if module.startswith("redis.") and type(exc).__name__ in ("ConnectionError", "TimeoutError", "AuthenticationError"):
        return True
    return module.startswith("kombu.") and type(exc).__name__ == "OperationalError"


def _is_storage_error(exc: BaseException) -> bool:
    module, name = type(exc).__module__, type(exc).__name__
    if module.startswith("botocore.") and ("Connect" in name or name in ("ReadTimeoutError", "NoCredentialsError")):
        return True
    if module.startswith("aiohttp.") and "Connect" in name:
        return True
    return isinstance(exc, ConnectionError)  # the builtin: refused, reset (HTTP, GCS, ...)


def classify(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line for ``exc`` (the first cause in its chain that is known)."""
    chain = _chain(exc)
    for item in chain:
        if isinstance(item, ModuleNotFoundError) and (item.name or "").split(".")[0] in EXTRA_OF_MODULE:
            module = item.name.split(".")[0]
            extra = EXTRA_OF_MODULE[module]
            return EXTRA_EXIT, (f"missing extra: this needs {module}, from the '{extra}' extra: "
                                f"pip install 'tokenmill[{extra}]'")
        if isinstance(item, ModelError):
            return MODEL_EXIT, f"model error: {_first_line(item)}"
        if _is_broker_error(item):
            return BROKER_EXIT, f"broker unreachable: {_first_line(item)}"
        if _is_storage_error(item):
            return STORAGE_EXIT, f"storage unreachable: {_first_line(item)}"
    return FAILED_EXIT, f"error: {type(exc).__name__}: {_first_line(exc)} (--debug shows the traceback)"


def hide_triton_without_gpu() -> None:
    """Without an NVIDIA device nothing runs Triton, yet torch imports it whenever it is installed
    (``torch._dynamo``, reached through transformers), and its nanobind module then prints ~30
    ``leaked instance`` lines at exit. Marking it absent makes torch take its no-Triton path."""
    if "triton" in sys.modules or os.environ.get("TOKENMILL_TRITON") == "1":
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible in ("", "-1") or not any(Path("/dev").glob("nvidia[0-9]*")):
        sys.modules["triton"] = None  # type: ignore[assignment]  # import triton -> ImportError


def _debug_callback(
    debug: bool = typer.Option(False, "--debug", help="show the traceback of a failure (also: TOKENMILL_DEBUG=1)"),
) -> None:
    if debug:
        os.environ["TOKENMILL_DEBUG"] = "1"


class TokenmillApp(typer.Typer):
    """A Typer app whose failures end as one line and a documented exit code."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.callback()(_debug_callback)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hide_triton_without_gpu()
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (the top: every failure becomes one line)
            if debug_enabled():
                traceback.print_exc()
            code, line = classify(exc)
            print(line, file=sys.stderr)
            raise SystemExit(code) from None
