"""A worker rank's process: join the group, then do what rank 0 says (build a model's shard,
run steps on it, drop it) until it says stop."""

from __future__ import annotations

import gc
import sys
import traceback
from multiprocessing.connection import Connection

import torch

from engine.parallel.group import init_group, leave_group
from engine.parallel.messages import Op
from engine.parallel.rank import build_rank_runner, tune_rank_threads


def worker_main(rank: int, size: int, port: int, device: str, num_threads: int | None, conn: Connection) -> None:
    """The spawned process's entry. It reports on ``conn``: ``("joining", None)`` before it joins
    the group, ``("error", text)`` if anything fails; then it exits with status 1."""
    try:
        if device == "cpu":
            tune_rank_threads(num_threads, size)
        conn.send(("joining", None))
        group = init_group(rank, size, port, device)
        runner = None
        while True:
            message = group.broadcast_message()
            if message.op is Op.STOP:
                break
            if message.op is Op.STEP:
                with torch.inference_mode():  # as rank 0's runner (weights built outside it)
                    runner.model(*message.model_args(runner.device))
            elif message.op is Op.COPY:
                runner.copy_blocks(message.pairs)
            elif message.op is Op.BUILD:
                runner = None
                b = message.build
                if device == "cpu":
                    tune_rank_threads(b.config.num_threads, size)
                runner = build_rank_runner(b.config, b.model_dir, b.max_model_len, group)
            elif message.op is Op.RELEASE:
                runner = None
                gc.collect()
        leave_group()
    except BaseException as exc:  # noqa: BLE001  (a rank's every failure goes to rank 0 as one line)
        traceback.print_exc()
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        sys.exit(1)
    finally:
        conn.close()
