"""Credential values never leave in text: every value a storage option resolved to is
remembered by this process and cut out of messages before they reach a user or a log.

Storage libraries quote what they were given ("Invalid endpoint: <value>", "The config
profile (<value>) could not be found"), so a spec that puts ``${env:NAME}`` where a library
echoes it would read the variable back. Deciding secrecy where the value is resolved,
not where each message is built, covers errors nobody has seen yet.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import quote, quote_plus

MIN_LENGTH = 8  # shorter values would garble ordinary text ("testing"); real credentials are longer
_lock = threading.Lock()
_values: dict[str, str] = {}  # a resolved value (and its URL-quoted forms) -> what to print instead


def remember(value: Any, name: str) -> None:
    """Redact ``value`` (a credential, or what ``${env:name}`` resolved to) from now on."""
    if not isinstance(value, str) or len(value) < MIN_LENGTH:
        return
    shown = f"${{env:{name}}}" if name else "[redacted]"
    install_log_redaction()  # from the first credential on, in whatever process this is
    with _lock:
        for form in {value, quote(value, safe=""), quote_plus(value), repr(value)[1:-1]}:
            if len(form) >= MIN_LENGTH:
                _values.setdefault(form, shown)


def redact(text: str) -> str:
    """``text`` with every remembered value replaced by its reference (longest first)."""
    if not _values or not isinstance(text, str):
        return text
    with _lock:
        pairs = sorted(_values.items(), key=lambda item: -len(item[0]))
    for value, shown in pairs:
        if value in text:
            text = text.replace(value, shown)
    return text


def forget_all() -> None:
    """For tests: start with nothing remembered."""
    with _lock:
        _values.clear()


_installed = False


def install_log_redaction() -> None:
    """Every log record of this process, its traceback included, is redacted when created
    (a record factory sees records of every logger, botocore's too, before any handler)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not _values:
            return record
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return record

    logging.setLogRecordFactory(factory)
