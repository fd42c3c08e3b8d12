"""Trainer -> server, over HTTP: the adapters that make a running policy server load new weights.
(What is pushed and when: ``agentgym.trainer.weight_sync``; the embedded server's receiving side:
``agentgym.server.weight_transfer``.)

One adapter per engine, each a few plain HTTP calls (``update_from_disk(url, path, version)``;
a state dict is first written to shared memory as a loadable model directory):

* **embedded**: a state dict from this host goes as handles of the memory it lives in (``POST
  /update_weights_from_ipc``: shared memory or CUDA IPC, see ``agentgym.model.weights``; the
  server copies once); from another machine, in safetensors buckets of ``device_buffer_size_M``
  MB (``update_in_buckets``: ``POST /update_weights_from_tensor?bucket=i&buckets=n``).
* **embedded** and **SGLang**: ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}``.
  SGLang also has ``/update_weights_from_tensor`` (``serialized_named_tensors``, one per TP
  rank, made by ``sglang.srt.utils.MultiprocessingSerializer``) and the NCCL pair
  ``/init_weights_update_group`` + ``/update_weights_from_distributed`` (the trainer
  broadcasts the tensors while the second call is in flight). SGLang drains or aborts
  running requests itself around an update.
* **vLLM**: a server started by ``agentgym.server.launchers`` (dev mode, with agentgym's worker
  extension); an update is ``POST /pause?mode=wait`` (vLLM versions that have it, so
  no response mixes versions), ``POST /collective_rpc {"method": "agentgym_load_weights",
  "args": [path]}``, ``POST /reset_prefix_cache``, ``POST /update_weight_version`` where offered,
  and ``POST /resume``.

A push that succeeds records its version for the server's URL (``agentgym.client.versions``), so
samples from servers whose answers carry no version (vLLM's) are reported with the right one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agentgym.client.tls import ssl_context
from agentgym.client.versions import record_weight_version


class WeightUpdateError(RuntimeError):
    pass


class _Weights:
    """Shared HTTP plumbing of the weight adapters."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        timeout: float = 1800.0,
        transport: httpx.BaseTransport | None = None,
        admin_key: str | None = None,
    ) -> None:
        self.model_dir = Path(model_dir) if model_dir else None
        self.timeout = timeout
        self._transport = transport  # tests pass a stand-in app's transport
        self.admin_key = admin_key  # sent as Authorization: Bearer (agentgym's embedded server requires it)

    def _post(
        self,
        url: str,
        path: str,
        json: Any = None,
        params: dict[str, Any] | None = None,
        optional: bool = False,
        content: bytes | None = None,
    ) -> Any:
        """POST and return the JSON body; ``optional``: a 404 (route missing in this version) returns None."""
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else None
        with httpx.Client(timeout=self.timeout, transport=self._transport, verify=ssl_context()) as client:
            response = client.post(url + path, json=json, params=params, headers=headers, content=content)
        if optional and response.status_code in (404, 405):
            return None
        if response.status_code >= 400:
            raise WeightUpdateError(f"{url}{path} answered {response.status_code}: {response.text[:500]}")
        try:
            body = response.json()
        except ValueError:
            return {}
        if isinstance(body, dict) and body.get("success") is False:
            raise WeightUpdateError(f"{url}{path} failed: {body.get('message', body)}")
        return body

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        raise NotImplementedError

    def pause(self, url: str, mode: str = "abort") -> Any:
        """Stop admitting; ``abort``: running generations end now with ``finish_reason="abort"`` and
        what they sampled so far (SGLang's route; the embedded server's too)."""
        return self._post(url, "/pause_generation", {"mode": mode})

    def resume(self, url: str) -> Any:
        return self._post(url, "/continue_generation", {})

    def update_from_state_dict(self, url: str, state: dict[str, Any], version: int) -> Any:
        """Write ``state`` to shared memory as a model directory, load it, remove it."""
        from agentgym.model.weights import push_dir, save_for_push

        directory = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=push_dir()))
        try:
            save_for_push(state, directory / "model.safetensors")
            self._copy_config(directory)
            return self.update_from_disk(url, str(directory), version)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _copy_config(self, directory: Path) -> None:
        """The served model's config files, so ``directory`` is a loadable model directory."""
        if self.model_dir is not None:
            for f in self.model_dir.glob("*.json"):
                if not f.name.endswith(".index.json"):  # the served model's shard index would mislead
                    shutil.copy(f, directory / f.name)


class EmbeddedWeights(_Weights):
    """agentgym's embedded server (SGLang's route and fields)."""

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        result = self._post(url, "/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})
        record_weight_version(url, version)
        return result

    def update_from_state_dict(self, url: str, state: dict[str, Any], version: int) -> Any:
        """A server on this host maps the tensors' own memory (``update_from_handles``); a server
        too old for that reads one safetensors file in shared memory."""
        answer = self.update_from_handles(url, state, version)
        if answer is not None:
            return answer
        from agentgym.model.weights import save_for_push

        path = save_for_push(state)
        try:
            return self.update_from_disk(url, str(path), version)
        finally:
            path.unlink(missing_ok=True)

    def update_from_handles(self, url: str, state: dict[str, Any], version: int) -> Any:
        """``POST /update_weights_from_ipc`` with handles of ``state``'s memory (CPU tensors move into
        shared memory the first time, in place); None when the server has no such route."""
        from agentgym.model.weights import share_handles

        return self.update_from_shared(url, share_handles(state), version)

    def update_from_shared(self, url: str, handles: dict[str, Any], version: int) -> Any:
        """``POST /update_weights_from_ipc`` with handles another process on this host made (a Ray
        worker's ``weight_handles``); None when the server has no such route."""
        answer = self._post(
            url, "/update_weights_from_ipc", {"tensors": handles, "weight_version": version}, optional=True
        )
        if answer is not None:
            record_weight_version(url, version)
        return answer

    def update_in_buckets(self, url: str, state: dict[str, Any], version: int, bucket_mb: float) -> Any:
        """Send ``state`` as safetensors bodies of at most ``bucket_mb`` MB (a server on another
        machine); the server loads them all at once when the last has arrived."""
        from agentgym.model.weights import buckets, safetensors_pieces

        parts = buckets(_unique_storages(state), bucket_mb)
        answer = None
        for i, part in enumerate(parts):
            size, pieces = safetensors_pieces({k: v.detach().to("cpu").contiguous() for k, v in part.items()})
            answer = self._send(
                url,
                f"/update_weights_from_tensor?weight_version={version}&bucket={i}&buckets={len(parts)}",
                size,
                pieces,
            )
        record_weight_version(url, version)  # the server loads them once the last bucket is in
        return answer

    def _send(self, url: str, path: str, size: int, pieces: list[Any]) -> Any:
        """POST a large body piece by piece from memory (the standard library's client: several
        times faster than httpx on bodies of hundreds of MB; the tests' stand-in transport aside)."""
        if self._transport is not None:
            return self._post(url, path, content=b"".join(bytes(p) for p in pieces))
        import http.client
        import json as json_module
        from urllib.parse import urlparse

        target = urlparse(url)
        if target.scheme == "https":
            conn: Any = http.client.HTTPSConnection(
                target.hostname, target.port, timeout=self.timeout, context=ssl_context()
            )
        else:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=self.timeout)
        try:
            conn.putrequest("POST", (target.path or "") + path)
            conn.putheader("Content-Type", "application/octet-stream")
            conn.putheader("Content-Length", str(size))
            if self.admin_key:
                conn.putheader("Authorization", f"Bearer {self.admin_key}")
            conn.endheaders()
            for piece in pieces:
                conn.send(piece)
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            conn.close()
        if response.status >= 400:
            raise WeightUpdateError(f"{url}{path} answered {response.status}: {text[:500]}")
        body = json_module.loads(text) if text else {}
        if isinstance(body, dict) and body.get("success") is False:
            raise WeightUpdateError(f"{url}{path} failed: {body.get('message', body)}")
        return body


def _unique_storages(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the second name of a tied weight (it travels once)."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else (id(tensor), 0)
        if key not in seen:
            seen.add(key)
            out[name] = tensor
    return out


class SGLangWeights(_Weights):
    """SGLang's weight routes (``sglang/srt/entrypoints/http_server.py``)."""

    def update_from_disk(self, url: str, path: str, version: int, abort_all_requests: bool = False) -> Any:
        """``path``: a model directory, or one safetensors file (SGLang loads directories only, so a
        file is linked into a temporary directory beside the served model's config files)."""
        if not Path(path).is_file():
            result = self._post(
                url,
                "/update_weights_from_disk",
                {"model_path": path, "weight_version": str(version), "abort_all_requests": abort_all_requests},
            )
            record_weight_version(url, version)
            return result
        from agentgym.model.weights import push_dir

        directory = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=push_dir()))
        try:
            (directory / "model.safetensors").symlink_to(Path(path).resolve())
            self._copy_config(directory)
            return self.update_from_disk(url, str(directory), version, abort_all_requests)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def update_from_tensors(
        self,
        url: str,
        named_tensors: dict[str, Any],
        version: int,
        tp_size: int = 1,
        serialize: Callable[[list[tuple[str, Any]]], str] | None = None,
        flush_cache: bool = True,
    ) -> Any:
        """Same-host tensors; ``serialize`` defaults to SGLang's ``MultiprocessingSerializer``
        (CUDA tensors travel as IPC handles, so the server reads the trainer's GPU memory)."""
        if serialize is None:
            from sglang.srt.utils import MultiprocessingSerializer  # type: ignore[import-not-found]

            def serialize(items: list[tuple[str, Any]]) -> str:
                return MultiprocessingSerializer.serialize(items, output_str=True)

        payload = serialize(list(named_tensors.items()))
        result = self._post(
            url,
            "/update_weights_from_tensor",
            {
                "serialized_named_tensors": [payload] * tp_size,
                "load_format": None,
                "flush_cache": flush_cache,
                "weight_version": str(version),
            },
        )
        record_weight_version(url, version)
        return result

    def init_weights_update_group(
        self,
        url: str,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> Any:
        """Join the server's workers to a process group with the trainer (rank 0, the broadcaster)."""
        return self._post(
            url,
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
        )

    def update_from_distributed(
        self,
        url: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
    ) -> Any:
        """Announce the tensors the trainer is about to broadcast in ``group_name``; returns once
        they are loaded, so call it from a thread while broadcasting."""
        result = self._post(
            url,
            "/update_weights_from_distributed",
            {
                "names": names,
                "dtypes": dtypes,
                "shapes": shapes,
                "group_name": group_name,
                "flush_cache": flush_cache,
                "weight_version": str(version),
            },
        )
        record_weight_version(url, version)
        return result


class VLLMWeights(_Weights):
    """vLLM, through its dev-mode ``/collective_rpc`` and agentgym's worker extension in every worker
    (``agentgym/server/vllm_extension/agentgym_vllm_extension.py``); LoRA
    adapters through vLLM's runtime adapter routes (a server started with ``--enable-lora``,
    ``--max-lora-rank`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: ``LORA_ARGS``, ``LORA_ENV``)."""

    LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}

    @staticmethod
    def lora_args(rank: int) -> list[str]:
        return ["--enable-lora", "--max-lora-rank", str(rank)]

    def load_lora_adapter(self, url: str, name: str, path: str, version: int) -> Any:
        """Serve peft's adapter directory ``path`` as model ``name`` (replacing the adapter loaded under
        that name, so clients keep asking for ``name``): ``/v1/unload_lora_adapter`` then
        ``/v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``, between ``/pause`` and ``/resume``
        where the server has them, so no response mixes two adapters."""
        paused = self._post(url, "/pause", params={"mode": "wait"}, optional=True) is not None
        try:
            with httpx.Client(timeout=self.timeout, transport=self._transport, verify=ssl_context()) as client:
                client.post(url + "/v1/unload_lora_adapter", json={"lora_name": name})  # none loaded yet: fine
            result = self._post(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
            self._post(url, "/update_weight_version", {"new_version": str(version)}, optional=True)
            record_weight_version(url, version)  # before resuming, as for full pushes
        finally:
            if paused:
                self._post(url, "/resume")
        return result

    def pause(self, url: str, mode: str = "abort") -> Any:
        """vLLM's ``/pause?mode=`` (``abort``: running requests return their partial output with
        ``finish_reason="abort"``; vLLM >= 0.11, its dev-mode RL routes)."""
        return self._post(url, "/pause", params={"mode": mode})

    def resume(self, url: str) -> Any:
        return self._post(url, "/resume")

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        paused = self._post(url, "/pause", params={"mode": "wait"}, optional=True) is not None
        try:
            result = self._post(url, "/collective_rpc", {"method": "agentgym_load_weights", "args": [path]})
            self._post(url, "/reset_prefix_cache", optional=True)
            self._post(url, "/update_weight_version", {"new_version": str(version)}, optional=True)
            record_weight_version(url, version)  # before resuming: every sample after it is on the new weights
        finally:
            if paused:
                self._post(url, "/resume")
        return result


def weights_adapter(backend: str, **kwargs: Any) -> _Weights:
    """The weight adapter of a server backend ("vllm", "sglang"; anything else: agentgym's embedded
    server), built with ``_Weights``' keyword arguments."""
    kinds: dict[str, type[_Weights]] = {"vllm": VLLMWeights, "sglang": SGLangWeights}
    return kinds.get(backend, EmbeddedWeights)(**kwargs)
