"""``WorkerGroup``: N copies of one worker class, as Ray actors or in this process; ``init_ray`` starts
or joins the Ray cluster they run on.

A method is named by the worker class's function (``group.call(PolicyWorker.update_actor, ...)``), so
a reader (and an editor's "go to definition") lands on the code that runs; a name string also works.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from agentgym.trainer.workers import Worker

Method = str | Callable[..., Any]
"""A worker method: the function itself (``PolicyWorker.update_actor``) or its name."""


def method_name(method: Method) -> str:
    return method if isinstance(method, str) else method.__name__


LOCAL_ONLY = ("num_cpus", "num_gpus", "resources", "include_dashboard", "object_store_memory")
"""``ray.init`` arguments that size a cluster this process starts; Ray refuses them when joining one."""


class ClusterUnreachable(ConnectionError):
    """The Ray cluster to join (``ray_address``) did not answer, or refused this process."""


_auth_defaulted = False
"""``default_ray_auth`` set ``RAY_AUTH_MODE`` (the user did not)."""


def default_ray_auth() -> None:
    """A Ray cluster agentgym starts itself runs without Ray's token authentication: ``RAY_AUTH_MODE=disabled``
    unless the user set a mode. ``init_ray`` takes that default back when it joins an existing cluster, so
    joining authenticates as a plain ``ray.init(address=...)`` would (``auto`` with ``~/.ray/auth_token``:
    token auth, which ``ray start --head`` turns on when that file exists)."""
    global _auth_defaulted
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        _auth_defaulted = True


def ray_address(cfg: DictConfig) -> str | None:
    """The cluster to join: ``ray_init.address`` (``auto`` or ``host:port``), else ``RAY_ADDRESS`` (set by
    ``ray job submit`` for its entrypoint, or by the user), else None: start a local cluster. ``local``
    (Ray's name for a new local cluster) also means None."""
    address = cfg.ray_init.address or os.environ.get("RAY_ADDRESS") or None
    return None if address in (None, "", "local") else str(address)


def init_ray(cfg: DictConfig) -> None:
    """Start a local Ray cluster, or join an existing one (``ray_address``): then the cluster's own
    resources are used, and ``num_cpus``/``num_gpus`` (which only size a new cluster) are not passed."""
    import ray

    global _auth_defaulted
    default_ray_auth()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Ray starts workers at nice 15; the trainer's workers are the main work, not background
    os.environ.setdefault("RAY_worker_niceness", "0")
    if ray.is_initialized():
        return
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.ray_init, resolve=True).items() if v is not None}
    kwargs.pop("address", None)
    kwargs.pop("timeline_json_file", None)  # not a ray.init argument: written at the end (main.write_ray_timeline)
    kwargs.setdefault("logging_level", logging.WARNING)
    kwargs.setdefault("log_to_driver", True)
    address = ray_address(cfg)
    if address:
        if _auth_defaulted:  # the cluster's authentication is the cluster's: not agentgym's local default
            os.environ.pop("RAY_AUTH_MODE", None)
            _auth_defaulted = False
        ignored = {k: kwargs.pop(k) for k in LOCAL_ONLY if k in kwargs and k != "include_dashboard"}
        kwargs.pop("include_dashboard", None)
        if ignored:
            logging.getLogger("agentgym.trainer").warning(
                "joining the Ray cluster at %s: ray_init %s only size a cluster agentgym starts, not one it "
                "joins (its nodes' `ray start --num-cpus/--num-gpus` do): not passed",
                address,
                ", ".join(f"{k}={v}" for k, v in ignored.items()),
            )
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as e:
            raise ClusterUnreachable(
                f"{e}. Check that `ray start --head` runs at {address} and that this machine reaches it. If Ray "
                "logged InvalidAuthToken above, the cluster uses token authentication (ray start --head turns it on "
                "where ~/.ray/auth_token exists): export RAY_AUTH_MODE=token here and give this machine the head's "
                "token (its ~/.ray/auth_token, or RAY_AUTH_TOKEN); see docs/cluster.md"
            ) from e
    else:
        kwargs.setdefault("num_cpus", os.cpu_count() or 1)
        ray.init(**kwargs)


class WorkerGroup:
    """``world_size`` copies of a worker class, one per rank: Ray actors (``use_ray``), or a
    single object in this process. ``call`` runs a method on every rank and returns the
    results in rank order; ``per_rank`` arguments give each rank its own value."""

    def __init__(
        self,
        cls: type[Worker],
        config: DictConfig,
        world_size: int,
        use_ray: bool,
        name: str = "",
        num_gpus: float = 0.0,
        placement_group: Any = None,
    ) -> None:
        self.cls = cls
        self.world_size = world_size
        self.use_ray = use_ray
        self.name = name or cls.__name__
        if use_ray:
            import ray

            remote = ray.remote(cls)
            self.workers = []
            for rank in range(world_size):
                options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus}
                if placement_group is not None:  # rank r of every group shares bundle r (one GPU)
                    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        placement_group, placement_group_bundle_index=rank
                    )
                self.workers.append(remote.options(**options).remote(config, rank, world_size))
        else:
            if world_size != 1:
                raise ValueError("a WorkerGroup without Ray holds exactly one worker")
            self.workers = [cls(config, 0, 1)]
        from agentgym.trainer.workers import Worker

        if self.call(Worker.needs_process_group)[0]:
            host, port = self.call_rank0(Worker.rendezvous_address)
            self.call(Worker.init_distributed, host, port)

    def call_async(
        self, method: Method, *args: Any, per_rank: Sequence[Sequence[Any]] | None = None, **kwargs: Any
    ) -> Any:
        """Start ``method`` on every rank; returns something ``get`` turns into the results."""
        method = method_name(method)
        if self.use_ray:
            futures = []
            for rank, worker in enumerate(self.workers):
                extra = tuple(per_rank[rank]) if per_rank is not None else ()
                futures.append(getattr(worker, method).remote(*args, *extra, **kwargs))
            return futures
        extra = tuple(per_rank[0]) if per_rank is not None else ()
        return [getattr(self.workers[0], method)(*args, *extra, **kwargs)]

    def get(self, pending: Any) -> list[Any]:
        if self.use_ray:
            import ray

            return ray.get(pending)
        return pending

    def call(
        self, method: Method, *args: Any, per_rank: Sequence[Sequence[Any]] | None = None, **kwargs: Any
    ) -> list[Any]:
        return self.get(self.call_async(method, *args, per_rank=per_rank, **kwargs))

    def call_rank0(self, method: Method, *args: Any, **kwargs: Any) -> Any:
        method = method_name(method)
        if self.use_ray:
            import ray

            return ray.get(getattr(self.workers[0], method).remote(*args, **kwargs))
        return getattr(self.workers[0], method)(*args, **kwargs)

    def put(self, value: Any) -> Any:
        """Share a large argument once (the Ray object store), not once per rank."""
        if self.use_ray:
            import ray

            return ray.put(value)
        return value

    def shutdown(self) -> None:
        if self.use_ray:
            import ray

            for worker in self.workers:
                with contextlib.suppress(Exception):  # best effort on the way out
                    ray.get(worker.shutdown.remote(), timeout=10)
                ray.kill(worker)
        else:
            self.workers[0].shutdown()
