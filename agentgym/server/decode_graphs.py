"""Decode steps on fixed shapes, replayed from CUDA graphs on a GPU.

A decode step on a GPU is dozens of small kernels per layer, and launching them from
Python costs more than running them at the batch sizes RL rollouts use. A CUDA graph
launches a whole step at once, but only for the shapes it was captured with, so a step is
padded to a bucket: the batch to the next of 1, 2, 4, 8, 16, 24, 32, 48, 64, ... rows (at most
the KV cache's slots: within a memory budget they can be fewer than the bucket), the
attention to the next power of two of columns (at least 64). Padding rows feed the pad
token, write their keys and values to the cache's scratch column and attend to anything:
their logits are thrown away. Inputs live in static buffers the graph reads; one memory
pool serves every captured graph.

Without ``capture`` the same padded step runs eagerly: what the graphs compute, on any
device (the CPU tests check the padding this way). A capture that fails turns graphs off
with a warning and the engine goes on eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("agentgym.server")


def size_buckets(max_rows: int) -> list[int]:
    sizes, size = [], 1
    while size < max_rows:
        sizes.append(size)
        size = size * 2 if size < 16 else size + size // 2 if size < 64 else size + 32
    return [*sizes, max_rows]


class DecodeGraphs:
    def __init__(
        self,
        forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
        kv: Any,
        max_rows: int,
        device: torch.device,
        pad_id: int,
        capture: bool,
    ) -> None:
        self.forward = forward
        self.kv = kv
        self.device = device
        self.pad_id = pad_id
        self.capture = capture
        self.sizes = size_buckets(max_rows)
        self.ids = torch.full((max_rows, 1), pad_id, dtype=torch.long, device=device)
        self.cols = torch.zeros((max_rows, 1), dtype=torch.long, device=device)
        self.rows = torch.arange(max_rows, device=device)[:, None]
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self.generation = kv.generation
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def buckets(self, rows: int, length: int) -> tuple[int, int]:
        # never past the cache's slots: a budget can leave fewer than the bucket (then the graph is of ``rows``)
        size = min(next(s for s in self.sizes if s >= rows), self.kv.slots)
        width = 64
        while width < length:
            width *= 2
        return size, min(width, self.kv.scratch)

    def invalidate(self) -> None:
        """Weights or cache storage moved: graphs captured on the old addresses must go. Their memory
        pool goes with them (the allocator frees a pool no graph holds), so the next capture starts a
        new one: capturing into a released pool fails an internal assert of CUDA's caching allocator
        (seen with torch 2.11 on an H100)."""
        self.graphs.clear()
        if self.capture:
            self.pool = torch.cuda.graph_pool_handle()

    def run(self, rows: int, length: int, next_tokens: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Logits of a decode step of the first ``rows`` slots (``cols``: each row's column)."""
        size, width = self.buckets(rows, length)
        if self.kv.generation != self.generation:
            self.invalidate()
            self.generation = self.kv.generation
        self.ids[:rows, 0] = next_tokens
        self.ids[rows:size] = self.pad_id
        self.cols[:rows] = cols
        self.cols[rows:size] = self.kv.scratch
        if not self.capture:
            return self._step(size, width)[:rows]
        graph = self.graphs.get((size, width))
        if graph is None:
            try:
                graph = self._capture(size, width)
            except Exception:  # noqa: BLE001 - any model code may refuse capture; eager still works
                log.warning("capturing a CUDA graph for decode failed; decoding eagerly from now on", exc_info=True)
                self.capture = False
                self.graphs.clear()
                return self._step(size, width)[:rows]
            self.graphs[(size, width)] = graph
        graph[0].replay()
        return graph[1][:rows]

    def _step(self, size: int, width: int) -> torch.Tensor:
        cols = self.cols[:size]
        positions = cols.masked_fill(cols == self.kv.scratch, 0)
        self.kv.bind(slice(0, size), self.rows[:size], cols, width)
        return self.forward(self.ids[:size], positions, cols, width)

    def _capture(self, size: int, width: int) -> tuple[Any, torch.Tensor]:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up off the capturing stream, as CUDA graphs require
            for _ in range(2):
                self._step(size, width)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._step(size, width)
        return graph, logits
