"""Tensor parallelism: one model split over the devices of one machine, one process per rank.

``group`` sets up the process group, ``layers`` holds the sharded modules, ``shard`` cuts a
loaded model down to one rank's part, ``driver`` starts the worker ranks and ``worker`` is
their loop. The scheduler and the sampler stay on rank 0 (the engine's own process).
"""
