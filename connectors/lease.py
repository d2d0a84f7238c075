"""The output lease (``_lease.json``): one run at a time writes an output folder.

Two runs on one output (two submits of a spec, a changed spec, ``tokenmill run`` beside a
fleet job) would mix their parts, and either could write the manifest and ``_SUCCESS``. A
run first takes the lease: ``{"run_id", "holder", "heartbeat", "ttl_s", "host", "pid", "pid_space"}``.
While another run's heartbeat is younger than its ``ttl_s`` the output is refused
(``OutputLeased`` names that run); a lease whose heartbeat is older is stale (its run died)
and is taken over. ``host``, ``pid`` and ``pid_space`` are set when the run lives in one
process (an embedded run, a finalizer publishing): a lease whose pid is gone from this very
pid space is taken over at once (``holder_gone``), without waiting for ``ttl_s``. The pid
space is the boot and the pid namespace (``/proc``), not the host name alone: two containers
or ``hostNetwork`` pods can share a host name, and the other's live pid is invisible here. A
fleet job's lease has no pid: the process that submitted it exits at once, and its workers
renew it.

Taking is an exclusive create (``open(..., "xb")``: ``If-None-Match: *`` on S3, ``O_EXCL``
locally), then a read-back of the run id, for stores that ignore the condition. Taking over
a stale lease deletes it first; two runs taking over the same stale lease at once can both
delete, but only one create succeeds. Renewing rewrites the lease after checking it is
still this run's (the check and the write are not one step: a run that lost the lease may
overwrite it once, within one heartbeat of going stale, which only a run dead for ``ttl_s``
and revived can do).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from connectors.manifest import read_optional_bytes, remove_optional, write_bytes
from connectors.storage import StorageError, filesystem_for, join_url, public_url, with_retries

log = logging.getLogger(__name__)

LEASE_NAME = "_lease.json"
DEFAULT_TTL_S = 120.0  # no heartbeat for this long: the holder is taken to be dead


@dataclass(frozen=True)
class Lease:
    run_id: str
    holder: str  # who runs it, for people: mode, host, pid
    heartbeat: float  # epoch seconds of the last renewal
    ttl_s: float
    host: str | None = None  # with pid: the one process that holds it (none for a fleet job)
    pid: int | None = None
    pid_space: str | None = None  # where pid means that process: boot id and pid namespace

    def is_stale(self, now: float) -> bool:
        return now - self.heartbeat > self.ttl_s

    def holder_gone(self) -> bool:
        """Its process was in this pid space and exists no more (a pid reused since reads as alive)."""
        return self._holder_here() is False

    def holder_alive_here(self) -> bool:
        """Its process is in this pid space and exists (another process than this one)."""
        return self._holder_here() is True

    def _holder_here(self) -> bool | None:
        """Whether its process exists, if it was in this pid space (not this process); else None."""
        if (self.pid is None or self.pid_space is None or self.host != socket.gethostname()
                or self.pid_space != pid_space() or self.pid == os.getpid()):
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # EPERM: alive, another user's
            return True
        return True

    def to_bytes(self) -> bytes:
        when = datetime.fromtimestamp(self.heartbeat, UTC).isoformat(timespec="seconds")
        return (json.dumps({**asdict(self), "heartbeat_at": when}, indent=2) + "\n").encode("utf-8")


class OutputLeased(StorageError):
    """Another live run holds the output (or took it over from this one)."""

    def __init__(self, output_url: str, lease: Lease | None, now: float) -> None:
        if lease is None:
            message = f"output {public_url(output_url)} is not leased to this run (its lease is gone)"
        else:
            message = (f"output {public_url(output_url)} is held by run {lease.run_id} ({lease.holder}), "
                       f"last heartbeat {max(0.0, now - lease.heartbeat):.0f} s ago; it is free when that run "
                       f"ends, or after {lease.ttl_s:.0f} s without a heartbeat")
        super().__init__(message, output_url)
        self.lease = lease


def lease_url(output_url: str) -> str:
    return join_url(output_url, LEASE_NAME)


def pid_space() -> str | None:
    """This process's pid space: the boot id and pid namespace (Linux); None where ``/proc``
    cannot say, so no pid there is taken for gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def read_lease(output_url: str, storage_options: dict | None = None) -> Lease | None:
    """The lease on the output, or None if there is none (an unreadable one counts as stale)."""
    data = read_optional_bytes(lease_url(output_url), storage_options)
    if data is None:
        return None
    try:
        raw = json.loads(data)
        pid = raw.get("pid")
        return Lease(str(raw["run_id"]), str(raw["holder"]), float(raw["heartbeat"]), float(raw["ttl_s"]),
                     raw.get("host"), None if pid is None else int(pid), raw.get("pid_space"))
    except (ValueError, KeyError, TypeError):
        return Lease("?", "unreadable lease", 0.0, 0.0)


def _create(output_url: str, lease: Lease, storage_options: dict | None) -> bool:
    """Exclusive create of the lease object; False if one exists already."""
    url = lease_url(output_url)
    fs, path = filesystem_for(url, storage_options)
    fs.makedirs(fs._parent(path), exist_ok=True)

    def create() -> None:
        with fs.open(path, "xb") as f:
            f.write(lease.to_bytes())

    try:
        with_retries(create, what=f"take {url}")
    except FileExistsError:
        return False
    except OSError:
        # SeaweedFS refuses the exclusive create of an existing key with 412 PreconditionFailed,
        # which s3fs raises as a plain OSError (moto's answer becomes FileExistsError).
        fs.invalidate_cache(path)
        if read_optional_bytes(url, storage_options) is not None:
            return False
        raise
    finally:
        fs.invalidate_cache(path)
    return True


def _remove(output_url: str, storage_options: dict | None) -> None:
    remove_optional(lease_url(output_url), storage_options)


def acquire_lease(
    output_url: str, run_id: str, holder: str, storage_options: dict | None = None, *,
    ttl_s: float = DEFAULT_TTL_S, now: float | None = None, this_process: bool = False,
) -> Lease:
    """Take the output for ``run_id`` (again, if it holds it already); ``OutputLeased`` if a
    live run holds it. A stale lease, or one whose process on this host is gone, is taken
    over. ``this_process``: the lease names this host and pid (the run lives in this process)."""
    for _ in range(3):
        t = time.time() if now is None else now
        where = (socket.gethostname(), os.getpid(), pid_space()) if this_process else (None, None, None)
        lease = Lease(run_id, holder, t, ttl_s, *where)
        if _create(output_url, lease, storage_options):
            held = read_lease(output_url, storage_options)
            if held is not None and held.run_id == run_id:
                return lease
            raise OutputLeased(output_url, held, t)
        held = read_lease(output_url, storage_options)
        if held is None:
            continue  # released meanwhile
        if held.run_id == run_id:
            renew_lease(output_url, run_id, storage_options, now=t)
            return lease
        gone = held.holder_gone()
        if not gone and not held.is_stale(t):
            raise OutputLeased(output_url, held, t)
        if gone:
            log.warning("taking over the lease of run %s on %s (%s): process %d is gone from this host",
                        held.run_id, public_url(output_url), held.holder, held.pid)
        _remove(output_url, storage_options)  # its run is dead: take over
    raise OutputLeased(output_url, read_lease(output_url, storage_options), time.time())


def check_lease(output_url: str, run_id: str, storage_options: dict | None = None) -> Lease:
    """The lease, if ``run_id`` holds it; else ``OutputLeased`` (another run took it over)."""
    held = read_lease(output_url, storage_options)
    if held is None or held.run_id != run_id:
        raise OutputLeased(output_url, held, time.time())
    return held


def renew_lease(output_url: str, run_id: str, storage_options: dict | None = None, *,
                now: float | None = None) -> None:
    """A heartbeat: rewrite the lease with the time now, if ``run_id`` still holds it."""
    held = check_lease(output_url, run_id, storage_options)
    lease = Lease(run_id, held.holder, time.time() if now is None else now, held.ttl_s, held.host, held.pid,
                  held.pid_space)
    write_bytes(lease_url(output_url), lease.to_bytes(), storage_options)


def release_lease(output_url: str, run_id: str | None, storage_options: dict | None = None) -> Lease | None:
    """Give the output up, if ``run_id`` holds it (None: whoever holds it, for an operator who
    knows its holder is dead); returns the lease removed, if one was."""
    held = read_lease(output_url, storage_options)
    if held is None or (run_id is not None and held.run_id != run_id):
        return None
    _remove(output_url, storage_options)
    return held
