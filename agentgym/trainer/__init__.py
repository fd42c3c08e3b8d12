"""The RL loop: the Ray PPO trainer, synchronous and asynchronous.

A map, in the order a step touches them:

* ``config.py``       the training config's meaning: defaults that follow from others, choices,
                      batch arithmetic (``load_config``)
* ``run.py``          ``train(cfg, source=...)``: servers, trajectory source and trainer for one run
                      (sources: ``agentgym.rollout.sources``; the stages around RL: ``agentgym.stages``)
* ``batch.py``        trajectories -> padded tensors; mini-batch plans shared by all ranks
* ``algos/``          the maths: advantage estimators, policy/value/KL losses, aggregation, off-policy
                      correction (veRL's names)
* ``step_checks.py`` what a step's trajectories are checked for: failed episodes (stop the run), samples
                      of lost weights (refused), groups whose rewards are all equal (warned about)
* ``workers.py``      actor (+ reference) and critic workers; ``forward.py`` their forward passes;
                      ``train_state.py`` model + optimizer per rank (FSDP2 or gloo data-parallel);
                      ``worker_group.py`` N ranks as Ray actors or in-process
* ``rollout_servers.py`` the rollout's policy servers (started here or given by URL)
* ``weight_sync.py``  trainer -> servers: pushing new weights to them
* ``ppo_trainer.py``  the single-controller loop (``PPOTrainer``)
* ``checkpoint.py``   veRL's ``global_step_N`` layout and resuming
* ``async_trainer.py`` the asynchronous mode (``async_loop.py``, ``staleness.py``, ``resource_pools.py``)

Around the loop, not in it: the checks before a run (``agentgym.preflight``), the progress line and
metrics backends (``agentgym.tracking``), the curves (``agentgym.plots``).

Configuration lives in ``configs/``: composed by ``agentgym.config``, given its meaning by
``agentgym.trainer.config``.
"""
