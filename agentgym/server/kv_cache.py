"""The engine's KV cache: one block of memory within a budget, in slots of one width.

Every layer's keys and values live in one tensor of shape
``(2, layers, slots, kv_heads, width, head_dim)``. A slot holds one sequence's cache, token
``t`` in column ``t``; the last column is scratch (padding tokens write there). Running
sequences occupy slots ``0 .. B-1`` (the engine keeps them packed), so a decode step's
attention reads the view ``[:B, :, :length]`` with no gather; finished sequences stay in
other slots as prefix-cache entries until their slot is needed.

The tensor is a view of the first ``slots x width`` columns of one buffer of ``budget`` bytes
(``kv_cache_memory_bytes``; on a CPU reserved at once as address space, elsewhere grown to the
extent in use). The width starts small and grows (up to ``max_len`` + 1) when a sequence needs
more columns, or shrinks when more slots are needed; ``slots x width`` never passes the budget,
and a re-layout (``relayout``) moves the kept columns within the buffer, never holding a second
copy. That happens a few times in a server's life, never per step; which layout, and what
happens to the prefix-cache entries that no longer fit, is the engine's choice (``Engine._fit``).

``SlotKVCache`` is a transformers ``Cache``: before each forward the engine says which slots
the batch rows are and which columns their tokens go to (``bind``); each attention layer
then calls ``update``, which writes the new keys/values there and returns the views the
attention reads. The mask is the engine's (a 4D tensor handed to the model), so the cache
answers no length questions.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers.cache_utils import Cache


def kv_shape(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a decoder config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return int(text.num_hidden_layers), kv_heads, head_dim


ATTENTION_KINDS = ("full_attention", "sliding_attention")


def column_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of one token of one sequence in the cache: every layer's key and value."""
    layers, kv_heads, head_dim = kv_shape(config)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def parse_bytes(value: int | str) -> int:
    """Bytes as vLLM's ``--kv-cache-memory-bytes`` takes them: an integer, or a number with a decimal
    (k, m, g, t: powers of 1000) or binary (K, M, G, T: powers of 1024) suffix: ``4G``, ``2.5g``."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if match:
        number, suffix = match.groups()
        scale = 1000 if suffix.islower() else 1024
        return int(float(number) * scale ** ("kmgt".index(suffix.lower()) + 1))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a number of bytes (e.g. 4294967296, 4G = 4 GiB, 4g = 4 GB)") from None


KV_CACHE_SHARE = 0.25  # of the memory available at start: the default budget


def available_memory(device: torch.device) -> int:
    """Bytes free for new allocations on ``device``: the kernel's MemAvailable on a CPU (psutil)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def default_kv_cache_bytes(config: Any, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> int:
    """The default budget: what ``slots`` slots of ``max_len`` tokens take, at most ``KV_CACHE_SHARE`` of
    the memory available now, and never less than one sequence of ``max_len`` tokens needs."""
    column = column_bytes(config, dtype)
    share = int(available_memory(torch.device(device)) * KV_CACHE_SHARE)
    return max(min(slots * (max_len + 1) * column, share), (max_len + 1) * column)


class SlotKVCache(Cache):
    """Keys and values of up to ``slots`` sequences of at most ``max_len`` tokens, in at most
    ``budget`` bytes (see the module docstring)."""

    is_compileable = False

    def __init__(
        self,
        config: Any,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        initial_width: int = 256,
        budget: int | None = None,
    ) -> None:
        super().__init__(layers=[])
        self.num_layers, self.kv_heads, self.head_dim = kv_shape(config)
        self.max_slots = slots
        self.max_len = max_len
        self.dtype = dtype
        self.device = torch.device(device)
        self.column_bytes = column_bytes(config, dtype)
        full = slots * (max_len + 1) * self.column_bytes
        self.budget = full if budget is None else int(budget)
        # the budget in columns (one token of one slot, every layer's key and value)
        self.columns = self.budget // self.column_bytes
        if self.columns < max_len + 1:
            raise ValueError(
                f"a KV cache of {self.budget / 2**20:.1f} MiB holds {self.columns - 1} tokens of one sequence, "
                f"fewer than max_model_len ({max_len}): give it at least "
                f"{(max_len + 1) * self.column_bytes} bytes (--kv-cache-memory-bytes) or a smaller --max-model-len"
            )
        # on a CPU the whole budget is reserved at once (address space only: a page costs memory once written);
        # elsewhere the buffer grows to the extent in use (its old contents copied)
        self._buffer = torch.empty(0, dtype=dtype, device=self.device)
        self._finite = 0  # elements at the buffer's start ever written (zeros or keys/values: never NaN)
        width = min(max_len, initial_width) + 1
        self.storage = self._layout(min(slots, self.columns // width), width)
        self.generation = 0  # bumped when the storage moves (captured CUDA graphs hold its address)
        self._rows: slice = slice(0, 0)
        self._write_rows: torch.Tensor | None = None
        self._write_cols: torch.Tensor | None = None
        self._length = 0

    def _layout(self, slots: int, width: int) -> torch.Tensor:
        """The buffer's first elements as a ``(2, layers, slots, kv_heads, width, head_dim)`` tensor."""
        shape = (2, self.num_layers, slots, self.kv_heads, width, self.head_dim)
        extent = 2 * self.num_layers * slots * self.kv_heads * width * self.head_dim
        if extent > self._buffer.numel():
            capacity = self.budget // self._buffer.element_size() if self.device.type == "cpu" else extent
            grown = torch.empty(capacity, dtype=self.dtype, device=self.device)
            grown[: self._finite] = self._buffer[: self._finite]
            self._buffer = grown
        # zeros, not garbage: attention multiplies masked-out values by a weight of 0, and 0 * NaN is NaN
        if extent > self._finite:
            self._buffer[self._finite : extent].zero_()
            self._finite = extent
        return self._buffer[:extent].view(shape)

    # ---- size --------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Slots in the current layout (at most ``max_slots``; fewer when the width leaves no room)."""
        return self.storage.shape[2]

    @property
    def width(self) -> int:
        """Columns per slot, the scratch column included."""
        return self.storage.shape[4]

    @property
    def scratch(self) -> int:
        """The column padding tokens write to (never read by a real token)."""
        return self.width - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the current layout (at most ``budget``)."""
        return self.storage.numel() * self.storage.element_size()

    def fits(self, slots: int, width: int) -> bool:
        """Whether ``slots`` slots of ``width`` columns (scratch included) fit the budget."""
        return slots * width <= self.columns

    def relayout(self, slots: int, width: int) -> None:
        """Lay the cache out as ``slots`` slots of ``width`` columns, in place: the first ``min`` slots
        keep their first ``min`` columns (the caller has moved or dropped what lies past either).
        No second copy of the cache is ever held: each layer's keys (then values) move through a
        buffer of their own size, in the order that never overwrites what is still to move."""
        if (slots, width) == (self.slots, self.width):
            return
        if not self.fits(slots, width) or width > self.max_len + 1 or slots > self.max_slots:
            raise ValueError(f"{slots} slots of {width} columns exceed the KV cache's budget or shape")
        old = self.storage
        keep_s, keep_w = min(slots, old.shape[2]), min(width, old.shape[4])
        new = self._layout(slots, width)  # may move the buffer (not on a CPU): read the old layout from it
        old = self._buffer[: old.numel()].view(old.shape)
        chunks = [(k, layer) for k in range(2) for layer in range(self.num_layers)]
        if new[0, 0].numel() > old[0, 0].numel():
            chunks.reverse()  # chunks move toward the end: the last first
        for k, layer in chunks:
            kept = old[k, layer, :keep_s, :, :keep_w].clone()
            new[k, layer, :keep_s, :, :keep_w] = kept
        self.storage = new
        self.generation += 1

    # ---- the engine's side -------------------------------------------------------------------
    def bind(self, rows: slice, write_rows: torch.Tensor, write_cols: torch.Tensor, length: int) -> None:
        """The next forward's batch: row ``i`` is slot ``rows.start + i``; its input token ``j`` is
        written to slot ``write_rows[i, 0]``, column ``write_cols[i, j]``; attention reads columns
        ``0 .. length-1``."""
        self._rows, self._write_rows, self._write_cols, self._length = rows, write_rows, write_cols, length

    def copy(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` columns of slot ``src`` into slot ``dst`` (every layer)."""
        if length > 0 and src != dst:
            self.storage[:, :, dst, :, :length] = self.storage[:, :, src, :, :length]

    def copy_many(self, src: list[int], dst: list[int], length: int) -> None:
        """``copy`` for several pairs at once (one indexed copy of ``length`` columns)."""
        if not src or length <= 0:
            return
        source = torch.tensor(src, device=self.device)
        target = torch.tensor(dst, device=self.device)
        self.storage[:, :, target, :, :length] = self.storage[:, :, source, :, :length]

    # ---- transformers' side ------------------------------------------------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.storage[0, layer_idx], self.storage[1, layer_idx]
        # (batch, heads, tokens, dim) -> (batch, tokens, heads, dim): the layout of keys[rows, :, cols]
        keys[self._write_rows, :, self._write_cols] = key_states.transpose(1, 2)
        values[self._write_rows, :, self._write_cols] = value_states.transpose(1, 2)
        return keys[self._rows, :, : self._length], values[self._rows, :, : self._length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._length, 0

    @property
    def is_sliding(self) -> list[bool]:  # transformers asks this of caches it was handed
        return [False] * self.num_layers

    def __len__(self) -> int:
        return self.num_layers

    def __repr__(self) -> str:
        return (
            f"SlotKVCache(slots={self.slots}, width={self.width}, layers={self.num_layers}, "
            f"{self.nbytes / 2**20:.1f} MiB)"
        )


class AttentionMasks:
    """The attention mask of a batch bound to the KV cache: query ``(i, j)`` (its token in column
    ``cols[i, j]``) sees columns ``0 .. cols[i, j]`` (and only the last ``sliding_window`` of
    them in sliding-window layers). Booleans for SDPA, additive floats for eager attention; a
    dict by layer kind for models that mix kinds."""

    def __init__(self, model: Any, device: torch.device, columns: int) -> None:
        config = model.config
        kinds = list(getattr(config, "layer_types", None) or [])
        window = getattr(config, "sliding_window", None)
        if not kinds:
            kinds = ["sliding_attention" if window else "full_attention"]
        unknown = sorted(set(kinds) - set(ATTENTION_KINDS))
        if unknown:
            raise ValueError(
                f"the embedded engine serves decoder models with full or sliding-window attention; "
                f"this model has {unknown} layers: serve it with vLLM or SGLang (--engine vllm)"
            )
        if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
            model.set_attn_implementation("sdpa")
        self.kinds = sorted(set(kinds))
        self.window = int(window) if window else None
        self.as_dict = len(self.kinds) > 1
        self.boolean = model.config._attn_implementation == "sdpa"
        self.dtype = next(model.parameters()).dtype
        self.columns = torch.arange(columns, device=device)

    def __call__(self, cols: torch.Tensor, length: int) -> Any:
        columns = self.columns[:length][None, None, None, :]
        query = cols[:, None, :, None]
        masks = {}
        for kind in self.kinds:
            allowed = columns <= query
            if kind == "sliding_attention" and self.window:
                allowed = allowed & (columns > query - self.window)
            if not self.boolean:
                allowed = torch.zeros(allowed.shape, dtype=self.dtype, device=cols.device).masked_fill_(
                    ~allowed, torch.finfo(self.dtype).min
                )
            masks[kind] = allowed
        return masks if self.as_dict else masks[self.kinds[0]]
