"""Server side, receiving: the embedded server's routes for the weight pushes that are not one
file on disk (the trainer's side: ``agentgym.client.weights``; a file: ``agentgym.model.weights``).

* ``/update_weights_from_ipc`` ``{"tensors": {name: handle}, "weight_version": N}``: the tensors
  live in memory a trainer on this host shares (``agentgym.model.weights.share_handles``:
  shared-memory files for CPU tensors, CUDA IPC handles for GPU ones); the server maps them and
  copies them into its weights, one copy in all.
* ``/update_weights_from_tensor?weight_version=N&bucket=i&buckets=n``: a safetensors body that is
  part ``i`` of ``n`` (a push from another machine, cut into buckets of
  ``checkpoint_engine.device_buffer_size_M`` MB). Parts are held until the last one arrives, then
  all load at once as version ``N``, so no response mixes versions; a part of another version
  drops what was held.
"""

from __future__ import annotations

from typing import Any


class BucketStaging:
    """Parts of one bucketed push, held until the last arrives."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.parts: dict[int, dict[str, Any]] = {}

    def add(self, version: int | None, index: int, count: int, part: dict[str, Any]) -> dict[str, Any] | None:
        """Hold part ``index`` of ``count``; the whole state once every part is in, else None."""
        if not 0 <= index < count:
            raise ValueError(f"bucket {index} of {count}: the index must be in [0, buckets)")
        if version != self.version:
            self.version, self.parts = version, {}
        self.parts[index] = part
        if len(self.parts) < count:
            return None
        state: dict[str, Any] = {}
        for i in range(count):
            state.update(self.parts[i])
        self.version, self.parts = None, {}
        return state


class SharedWeights:
    """The trainer memory this server has mapped: kept between pushes, since a trainer that updates
    its tensors in place sends the same handles each time and mapping them afresh would fault in
    every page again (the mappings of the last push are held; none once the trainer's handles change)."""

    def __init__(self) -> None:
        self.mapped: dict[tuple, Any] = {}

    def open(self, body: Any) -> tuple[dict[str, Any], int | None]:
        """``(state, version)`` from an ``/update_weights_from_ipc`` body."""
        from agentgym.model.weights import open_handles

        if not isinstance(body, dict) or not isinstance(body.get("tensors"), dict):
            raise ValueError('the body must be {"tensors": {name: handle, ...}, "weight_version": N}')
        version = body.get("weight_version")
        return open_handles(body["tensors"], self.mapped), None if version is None else int(version)
