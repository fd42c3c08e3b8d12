"""Weight files and shared memory: the formats both sides of a push use (the trainer writes or
shares, a policy server reads them from a path or maps them and copies them into a model).

Directions: trainer -> server, ``agentgym.trainer.weight_sync`` (what to push, when) over
``agentgym.client.weights`` (each engine's HTTP routes); server side, ``agentgym.server.weight_transfer``
(receiving) and ``agentgym.server.lora_adapters`` (applying LoRA adapters).

Three ways, from the cheapest:

* **Handles** (same host): ``share_handles`` turns a state dict into JSON-able handles of the
  memory it already lives in (CPU tensors: their storage is moved into a named shared-memory
  file once, in place, so an optimizer that updates them in place keeps writing there; CUDA
  tensors: CUDA IPC handles, nothing moves), and the server's ``open_handles`` maps the same
  memory. A push is then one copy, the server's, into its own weights.
* **A file** (same host, any engine): the trainer writes one safetensors file under
  ``/dev/shm`` (``save_for_push``) and the server reads it back (``load_weights``): two copies.
* **Buckets** (across machines): ``buckets`` cuts a state dict into parts of at most
  ``async_training.checkpoint_engine.device_buffer_size_M`` MB, each sent on its own.

``benchmarks/weight_sync.py`` measures them against a plain state-dict copy.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

_counter = itertools.count()


def push_dir() -> Path:
    """``/dev/shm`` where it exists and is writable (RAM-backed), else the temp directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


# safetensors dtype names <-> torch dtypes (the format: u64 header length, JSON header, raw data)
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def safetensors_pieces(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> tuple[int, list[Any]]:
    """A safetensors file as ``(size, pieces)``: the header, then each tensor's memory as it is (no
    copy; the tensors must be contiguous CPU tensors), to write or send piece by piece."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned
    pieces: list[Any] = [struct.pack("<Q", len(raw)) + raw]
    pieces += [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in tensors.values() if t.numel()]
    return 8 + len(raw) + offset, pieces


def write_safetensors(
    tensors: dict[str, torch.Tensor], path: str | os.PathLike[str], metadata: dict[str, str] | None = None
) -> None:
    """Write a standard safetensors file, each tensor's bytes straight from its memory (one copy;
    ``safetensors.torch.save_file`` makes a ``bytes`` of every tensor first)."""
    with open(path, "wb") as f:
        for piece in safetensors_pieces(tensors, metadata)[1]:
            f.write(piece)


def tensors_from_bytes(raw: bytes | bytearray) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in memory, as views of it (nothing copied)."""
    (length,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(bytes(raw[8 : 8 + length]))
    header.pop("__metadata__", None)
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        with warnings.catch_warnings():  # a bytes body is read-only; these tensors are only read from
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(raw, dtype=torch.uint8, count=end - begin, offset=8 + length + begin)
        out[name] = flat.view(dtype).view(info["shape"])
    return out


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A safetensors file as tensors that view a private memory map of it: nothing is copied
    until the tensors are (on ``/dev/shm`` the pages are already in RAM)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        if os.fstat(f.fileno()).st_size == 8 + length:
            mm = None
        else:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    header.pop("__metadata__", None)
    start = 8 + length
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin or mm is None:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mm, dtype=torch.uint8, count=end - begin, offset=start + begin)
        out[name] = flat.view(dtype).view(info["shape"])
    return out


def save_for_push(state_dict: dict[str, torch.Tensor], path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``state_dict`` as one safetensors file (default: a fresh name under ``push_dir()``).

    Tensors sharing storage (tied embeddings) are written once, under their first name. The
    file appears atomically (written under a temporary name, then renamed).
    """
    target = (
        Path(path) if path is not None else push_dir() / f"agentgym-weights-{os.getpid()}-{next(_counter)}.safetensors"
    )
    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else (id(tensor), 0)
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.to("cpu").contiguous()
    tmp = target.with_name(target.name + ".tmp")
    write_safetensors(out, tmp)
    tmp.rename(target)
    return target


def load_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A state dict from a safetensors file, a ``.bin``/``.pt`` file, or a Hugging Face model directory.

    Safetensors tensors are views of a memory map of the file (see ``read_safetensors``).
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("pytorch_model*.bin"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin files in {p}")
    elif p.is_file():
        files = [p]
    else:
        raise FileNotFoundError(f"no weights at {p}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            state.update(read_safetensors(f))
        else:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return state


def apply_state_dict(model: Any, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy ``state_dict`` into ``model``'s parameters and buffers in place.

    Every name must be one of the model's (an optional ``model.`` / ``module.`` prefix mismatch
    is not guessed at); a model parameter may be missing only when it is tied to one that is
    present (``lm_head.weight`` with tied embeddings). Shapes must match. Raises ``ValueError``
    before copying anything if they do not.
    """
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    unknown = [k for k in state_dict if k not in targets]
    if unknown:
        raise ValueError(f"weights not in the model: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    bad = [
        f"{k}: {tuple(v.shape)} vs {tuple(targets[k].shape)}"
        for k, v in state_dict.items()
        if tuple(v.shape) != tuple(targets[k].shape)
    ]
    if bad:
        raise ValueError(f"weight shapes differ from the model's: {bad[:5]}")
    given = {targets[k].data_ptr() for k in state_dict}
    missing = [
        k
        for k, t in model.named_parameters(remove_duplicate=False)
        if k not in state_dict and t.data_ptr() not in given
    ]
    if missing:
        raise ValueError(f"weights missing for: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for name, tensor in state_dict.items():
            targets[name].copy_(tensor)


def bind_state_dict(model: Any, state_dict: dict[str, torch.Tensor]) -> bool:
    """Make ``model``'s parameters and buffers *be* ``state_dict``'s tensors (no copy: later in-place
    changes to those tensors are the model's). Returns False, changing nothing, unless every
    tensor of the model has a counterpart of the same shape, dtype and device (tied weights
    follow their first name)."""
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    if any(k not in targets for k in state_dict):
        return False
    bound: dict[int, torch.Tensor] = {}
    plan = []
    for name, target in targets.items():
        source = state_dict.get(name)
        if source is None:
            if id(target) in bound or name.endswith(("inv_freq", "original_inv_freq")):
                continue  # a tied weight bound under another name, or a buffer computed from the config
            return False
        source = source.detach()
        if source.shape != target.shape or source.dtype != target.dtype or source.device != target.device:
            return False
        bound[id(target)] = source
        plan.append((target, source))
    for target, source in plan:
        target.data = source
    return True


def buckets(state: dict[str, Any], size_mb: float) -> list[dict[str, Any]]:
    """``state`` cut into dicts of at most ``size_mb`` MB each (a larger tensor travels alone)."""
    limit = max(1.0, float(size_mb)) * 2**20
    out: list[dict[str, Any]] = [{}]
    used = 0.0
    for name, tensor in state.items():
        size = float(tensor.numel() * tensor.element_size())
        if out[-1] and used + size > limit:
            out.append({})
            used = 0.0
        out[-1][name] = tensor
        used += size
    return out


# ---- handles: the same memory, seen from another process on this host -----------------------------
def share_handles(state: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """JSON-able handles of ``state``'s memory (see the module docstring).

    A CPU tensor's storage moves into shared memory the first time (its data is copied there
    once, the tensor keeps working as before); afterwards this costs nothing. The caller must
    keep the tensors alive until the receiver has read them (CUDA memory is not refcounted
    across processes here).
    """
    out: dict[str, dict[str, Any]] = {}
    for name, tensor in state.items():
        tensor = tensor.detach()
        storage = tensor.untyped_storage()
        info: dict[str, Any] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "offset": tensor.storage_offset(),
        }
        if tensor.is_cuda:
            device, handle, size, offset, *_ = storage._share_cuda_()
            info.update(
                kind="cuda", device=int(device), handle=handle.hex(), size=int(size), storage_offset_bytes=int(offset)
            )
        else:
            manager, handle, size = storage._share_filename_cpu_()
            info.update(kind="shm", manager=manager.decode(), handle=handle.decode(), size=int(size))
        out[name] = info
    return out


def open_handles(handles: dict[str, dict[str, Any]], mapped: dict[tuple, Any] | None = None) -> dict[str, torch.Tensor]:
    """Tensors over the memory ``share_handles`` described (in this process: a mapping, no copy).

    ``mapped``: storages opened by earlier calls, reused when a handle comes again (a trainer
    updating its tensors in place sends the same handles every push, and a fresh mapping would
    fault in every page again); left holding this call's storages only.
    """
    out: dict[str, torch.Tensor] = {}
    storages: dict[tuple, Any] = {}
    previous = mapped if mapped is not None else {}
    for name, info in handles.items():
        key = (info["kind"], info["handle"], int(info["size"]), info.get("manager"), info.get("storage_offset_bytes"))
        opened = storages.get(key) or previous.get(key)
        if opened is None:
            if info["kind"] == "shm":
                opened = _open_shm(info)
            elif info["kind"] == "cuda":
                opened = (_open_cuda(info), 0)
            else:
                raise ValueError(f"{name}: unknown handle kind {info['kind']!r} (expected 'shm' or 'cuda')")
        storages[key] = opened
        storage, header = opened
        dtype = _DTYPES[info["dtype"]]
        tensor = torch.empty(0, dtype=dtype, device=storage.device)
        offset = int(info["offset"]) + header // tensor.element_size()
        out[name] = tensor.set_(storage, offset, info["shape"], info["stride"])
    if mapped is not None:
        mapped.clear()
        mapped.update(storages)
    return out


def _open_shm(info: dict[str, Any]) -> tuple[Any, int]:
    """A plain shared mapping of the sender's shared-memory file, and where its data starts.

    Not through torch's shm manager (``_new_shared_filename_cpu``): freeing such a storage sends a
    message to the sender's manager process, and once the sender has gone with it (Ray kills its
    workers at shutdown) that aborts this process ("Broken pipe" in THManagedMapAllocator::close).
    torch keeps a reference count ahead of the data in the file: the bytes beyond ``size``."""
    path = Path("/dev/shm") / info["handle"].lstrip("/")
    size = int(info["size"])
    try:
        total = path.stat().st_size
    except OSError:  # no /dev/shm here (not Linux): torch's own way
        return torch.UntypedStorage._new_shared_filename_cpu(info["manager"].encode(), info["handle"].encode(), size), 0
    header = total - size
    if header < 0 or header % 8:
        raise ValueError(
            f"{path} holds {total} bytes for a {size}-byte storage: not a torch shared-memory "
            "file (was it freed before the push?)"
        )
    return torch.UntypedStorage.from_file(str(path), shared=True, nbytes=total), header


def _open_cuda(info: dict[str, Any]) -> Any:
    """A CUDA storage over another process's memory (``cudaIpcOpenMemHandle``); the sender keeps
    the memory alive until the push has returned."""
    device = int(info["device"])
    with torch.cuda.device(device):
        return torch.UntypedStorage._new_shared_cuda(
            device,
            bytes.fromhex(info["handle"]),
            int(info["size"]),
            int(info["storage_offset_bytes"]),
            None,
            0,
            None,
            False,
        )
