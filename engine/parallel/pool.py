"""The worker ranks' processes and the process group they share with rank 0 (this process).

A pool outlives an engine only where its closer asks (``keep``): the next tensor-parallel
engine of the same size and device then sends its model to the same processes instead of
spawning new ones (seconds of interpreter and torch start-up each; the test suite's families
share one pair). Otherwise closing the engine stops them.
"""

from __future__ import annotations

import contextlib
import logging
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.parallel.group import ParallelGroup, free_port, init_group, leave_group, timeout
from engine.parallel.messages import Op, StepMessage
from engine.parallel.worker import worker_main

log = logging.getLogger(__name__)

REPORT_WAIT_S = 10.0  # how long a failed collective waits for the failing rank's own report


class TensorParallelError(RuntimeError):
    """A rank failed: the group is broken and the engine must be rebuilt (not one request's fault)."""

    fatal = True  # StepFaults re-raises it instead of failing requests one by one


class RankPool:
    """Ranks ``1 .. size - 1`` as spawned processes, each reporting on a pipe, and the group."""

    _kept: RankPool | None = None  # a pool an engine left for the next one (``release(keep=True)``)

    @classmethod
    def acquire(cls, size: int, device: str, config: EngineConfig) -> RankPool:
        kept, cls._kept = cls._kept, None
        if kept is not None and kept.size == size and kept.device == device and kept.alive():
            return kept
        if kept is not None:
            kept.stop()
        if torch.distributed.is_initialized():
            raise RuntimeError("this process already belongs to a process group: close the other "
                               "tensor-parallel engine first (one per process)")
        return cls(size, device, config)

    @classmethod
    def stop_kept(cls) -> None:
        """Stop the pool an engine left behind, if any."""
        kept, cls._kept = cls._kept, None
        if kept is not None:
            kept.stop()

    def __init__(self, size: int, device: str, config: EngineConfig) -> None:
        self.size, self.device = size, device
        self.processes: list = []
        self.conns: list = []
        self.group: ParallelGroup | None = None
        port = free_port()
        ctx = mp.get_context("spawn")
        for rank in range(1, size):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(rank, size, port, device, config.num_threads, send),
                               name=f"tokenmill-tp-rank{rank}", daemon=True)
            proc.start()
            send.close()
            self.processes.append(proc)
            self.conns.append(receive)
        try:
            self._wait_for_joining()
            self.group = init_group(0, size, port, device)
        except Exception as exc:
            error = self.error_from(exc)
            self.stop()
            raise error from exc

    def _wait_for_joining(self) -> None:
        """Every worker says it is about to join before rank 0 waits in the rendezvous (a worker
        that dies while importing would otherwise leave rank 0 waiting out the timeout)."""
        pending = dict(zip(self.conns, self.processes, strict=True))
        while pending:
            ready = wait([*pending, *(p.sentinel for p in pending.values())], timeout().total_seconds())
            if not ready:
                raise TimeoutError("worker ranks did not start in time")
            for conn, proc in list(pending.items()):
                rank = self.conns.index(conn) + 1
                if conn in ready:
                    what, text = conn.recv()
                    if what != "joining":
                        raise TensorParallelError(f"tensor-parallel rank {rank} failed: {text}")
                    del pending[conn]
                elif proc.sentinel in ready:
                    raise TensorParallelError(f"tensor-parallel rank {rank} exited with code {proc.exitcode} "
                                              "before joining")

    def alive(self) -> bool:
        return self.group is not None and all(p.is_alive() for p in self.processes)

    def send(self, message: StepMessage) -> None:
        self.group.broadcast_message(message)

    def error_from(self, exc: Exception) -> TensorParallelError:
        """The error of the worker that failed (its own report, or how it exited), else rank 0's."""
        if isinstance(exc, TensorParallelError):
            return exc
        wait([*self.conns, *(p.sentinel for p in self.processes)], REPORT_WAIT_S)
        for rank, (conn, proc) in enumerate(zip(self.conns, self.processes, strict=True), start=1):
            report = None
            with contextlib.suppress(EOFError, OSError):
                while conn.poll():
                    what, text = conn.recv()
                    if what == "error":
                        report = text
            if report is not None:
                return TensorParallelError(f"tensor-parallel rank {rank} failed: {report}")
            if proc.exitcode is not None:
                return TensorParallelError(f"tensor-parallel rank {rank} exited with code {proc.exitcode}")
        return TensorParallelError(f"tensor-parallel step failed on rank 0: {type(exc).__name__}: {exc}")

    def release(self, keep: bool, healthy: bool) -> None:
        """An engine is done with the pool: keep it for the next engine, or stop it."""
        if keep and healthy and self.alive():
            with contextlib.suppress(Exception):
                self.send(StepMessage(Op.RELEASE))
                RankPool._kept = self
                return
        self.stop(healthy)

    def stop(self, healthy: bool = True) -> None:
        """A STOP message where the group still works, then reap the processes (kill the stuck)."""
        if healthy and self.alive():
            with contextlib.suppress(Exception):
                self.send(StepMessage(Op.STOP))
        for proc in self.processes:
            proc.join(timeout=30 if healthy else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.group = None
        leave_group()
