"""The run directory on a cluster: one location every node sees, fixed once on the driver.

Checkpoints, the Hugging Face export, the warm start's SFT model and the held-out table are written
by whichever process holds the work (the driver, or a worker's rank 0 on any node) and read by
others (the driver scores the export, every rank reads a checkpoint at resume, RL workers load the
SFT model). So:

* ``resolve_run_dir``: ``trainer.default_local_dir`` becomes an absolute path on the driver, before
  any stage, and that path is what workers get (a relative one would be resolved against each
  process's own working directory: a Ray worker's is not the driver's, and a ``ray job submit``
  entrypoint's is a copy of the job's ``working_dir`` that Ray deletes, or without one the directory
  ``ray start`` ran in on the node the driver landed on). A relative directory in a
  Ray job entrypoint (or inside such a copy) is refused. Storage URIs (``s3://``, ``gs://``...) are
  refused with the way out: checkpoints are written with file APIs, so the bucket is mounted on every
  node (s3fs, gcsfuse, blobfuse2) and its mount path given.
* ``check_shared``: before a worker group on Ray does any work, the driver writes a marker file in
  the run directory; every rank reads it and writes one of its own, which the driver reads back. A
  rank that cannot (a node with its own local disk at that path) stops the run there, with the
  nodes named and the way out (shared storage, or the trainer pool on the driver's node).
* ``check_nodes_share``: the same check before the first stage of a run that joins a cluster (the warm
  start's demos and SFT come before RL's workers exist): one short task on every node that can hold a
  trainer rank, so a run directory the cluster does not share costs seconds, not the warm start.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.config import ConfigError

MARKER = ".agentgym-shared-"
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor for a ``ray job submit`` entrypoint."""


class RunDirNotShared(ConfigError):
    """A worker cannot see the run directory the driver writes."""


def resolve_run_dir(value: str | os.PathLike[str], key: str = "trainer.default_local_dir") -> str:
    """``value`` as an absolute path of this (the driver's) machine; refuses what cannot work on a
    cluster (see the module docstring)."""
    text = str(value)
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme == "file":
        text = text.removeprefix("file://")
    elif scheme:
        raise ConfigError(
            f"{key}={text}: agentgym writes checkpoints and models with file APIs, not to a storage URI. "
            f"Mount the bucket at the same path on every node (s3fs / mountpoint-s3, gcsfuse, blobfuse2, or "
            f"an NFS/EFS/Filestore share) and set {key} to that path; see docs/cluster.md"
        )
    path = Path(text).expanduser()
    if path.is_absolute():
        return str(path)
    cwd = Path.cwd()
    # a `ray job submit` entrypoint (Ray sets this variable for it) runs in Ray's copy of the job's
    # working_dir (gone when the job is), or without one in the directory `ray start` ran in on its node
    if RAY_JOB_ENV in os.environ or "runtime_resources" in cwd.parts:
        where = (
            "Ray's copy of the job's working_dir, which Ray deletes"
            if "runtime_resources" in cwd.parts
            else "the directory `ray start` ran in on the node the job's driver landed on, not one you chose"
        )
        raise ConfigError(
            f"{key}={text} is relative, and this driver runs as a Ray job in {cwd} ({where}): set {key} to an "
            "absolute path on storage every node mounts (ray job submit -- agentgym train ... "
            "trainer.default_local_dir=/shared/runs/NAME)"
        )
    return str((cwd / path).resolve())


def resolve_in_config(cfg: Any) -> str:
    """Set ``trainer.default_local_dir`` of ``cfg`` to its absolute form (idempotent); returns it."""
    cfg.trainer.default_local_dir = resolve_run_dir(cfg.trainer.default_local_dir)
    return cfg.trainer.default_local_dir


def sees_run_dir(root: str, token: str, rank: int) -> dict[str, Any]:
    """On a worker: read the driver's marker in ``root`` and leave one of this rank's beside it."""
    marker = Path(root) / f"{MARKER}{token}"
    try:
        seen = marker.read_text() == token
    except OSError:
        seen = False
    if seen:
        try:
            (Path(root) / f"{MARKER}{token}-rank{rank}").write_text(token)
        except OSError:
            seen = False
    try:
        import ray

        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except Exception:  # noqa: BLE001 - informational
        ip = "?"
    return {"rank": rank, "read": seen, "host": socket.gethostname(), "ip": ip}


def check_shared(group: Any, root: str | os.PathLike[str]) -> None:
    """Refuse ``root`` unless every rank of ``group`` (a ``WorkerGroup`` on Ray) reads what this
    process writes there and this process reads what every rank writes (see the module docstring)."""
    if not group.use_ray:
        return
    root = Path(root)
    blind = _blind_readers(root, lambda token: group.call("sees_run_dir", str(root), token))  # Worker.sees_run_dir
    if blind:
        _refuse(root, ", ".join(f"rank {r['rank']} on {r['host']} ({r['ip']})" for r in blind))


def check_nodes_share(root: str | os.PathLike[str], pool_resource: str) -> None:
    """Refuse ``root`` unless every alive node of the Ray cluster this process is connected to that can hold a
    trainer rank (those offering ``pool_resource``, the trainer pool's, when any does) reads what this process
    writes there, and writes what this process reads: ``check_shared`` before any worker exists."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    pool = [n for n in nodes if n.get("Resources", {}).get(pool_resource)]
    root = Path(root)
    probe = ray.remote(num_cpus=0)(sees_run_dir)

    def ask(token: str) -> list[dict]:
        return ray.get(
            [
                probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                    str(root), token, i
                )
                for i, n in enumerate(pool or nodes)
            ]
        )

    blind = _blind_readers(root, ask)
    if blind:
        _refuse(root, ", ".join(f"a worker on {r['host']} ({r['ip']})" for r in blind))


def _blind_readers(root: Path, ask: Callable[[str], list[dict]]) -> list[dict]:
    """Write a marker with a fresh token in ``root``, ``ask(token)`` the readers (each runs ``sees_run_dir``),
    and return the reports of those that could not read it or whose answer this process cannot see; the
    markers are removed whatever happens."""
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    (root / f"{MARKER}{token}").write_text(token)
    try:
        reports = ask(token)
        return [r for r in reports if not r["read"] or not (root / f"{MARKER}{token}-rank{r['rank']}").is_file()]
    finally:
        for path in root.glob(f"{MARKER}{token}*"):
            path.unlink(missing_ok=True)


def _refuse(root: Path, where: str) -> None:
    raise RunDirNotShared(
        f"the run directory {root} is not shared with every node: {where} cannot see the files this "
        f"driver ({socket.gethostname()}) writes there. Checkpoints, the final model and the warm start "
        "are written by the rank that holds them and read by others, so put trainer.default_local_dir on "
        "storage every node mounts at the same path (NFS, a cluster filesystem, a bucket mounted with "
        "s3fs/gcsfuse), or keep the trainer pool on this node (ray start there with --resources "
        "'{\"agentgym_trainer_pool\": N}'); see docs/cluster.md"
    )
