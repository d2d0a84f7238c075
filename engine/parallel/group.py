"""The tensor-parallel process group: which rank this process is and the collectives the
sharded layers call (NCCL on CUDA, gloo on CPU; step messages always go over gloo)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a collective waits for the other ranks before it fails instead of hanging. A rank
# that dies closes its sockets and fails its peers' collectives at once; this bounds the rest
# (a rank stuck in a long load or a kernel).
TIMEOUT_ENV = "TOKENMILL_TP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


def timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))


def free_port() -> int:
    """A loopback port for the rendezvous (rank 0 listens on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device: str, rank: int) -> torch.device:
    """Rank ``r`` runs on ``cuda:base+r`` for ``device`` ``cuda:base`` (``cuda``: base 0); on the CPU."""
    d = torch.device(device)
    if d.type != "cuda":
        return d
    return torch.device("cuda", (d.index or 0) + rank)


@dataclass
class ParallelGroup:
    """This process's place in the group, and the collectives over it."""

    rank: int
    world_size: int
    device: torch.device
    control: object  # the gloo group the driver's pickled step messages travel on

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; every rank gets the same values."""
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' ``x`` side by side along the last axis, in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    def broadcast_message(self, message: object = None) -> object:
        """Rank 0's ``message`` on every rank (pickled; the others pass None)."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def agree_min(self, value: int) -> int:
        """The smallest of the ranks' ``value`` (the KV pool every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())


def init_group(rank: int, world_size: int, port: int, device: str) -> ParallelGroup:
    """Join the group of ``world_size`` ranks whose rank 0 listens on ``port``."""
    dev = rank_device(device, rank)
    backend = "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        backend = "nccl"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timeout())
    control = dist.new_group(backend="gloo", timeout=timeout()) if backend == "nccl" else dist.group.WORLD
    return ParallelGroup(rank, world_size, dev, control)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
