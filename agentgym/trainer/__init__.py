"""The Ray PPO trainer: ``agentgym train``.

A map, in the order a step touches them:

* ``sources.py``     where trajectories come from (``TrajectorySource``: env rollouts, fixed
                     batches, the gateway's agents) and the data order (``TaskSampler``)
* ``batch.py``       trajectories -> padded tensors; mini-batch plans shared by all ranks
* ``algos.py``       the maths: advantage estimators, policy/value/KL losses (veRL's names)
* ``workers.py``     actor (+ reference) and critic workers, FSDP2 or gloo data-parallel,
                     and ``WorkerGroup`` (Ray actors or in-process)
* ``weight_sync.py`` the rollout side's policy servers and pushing new weights to them
* ``ppo_trainer.py`` the single-controller loop (``PPOTrainer``)
* ``checkpoint.py``  veRL's ``global_step_N`` layout and resuming
* ``loggers.py``     progress line, console / JSONL / TensorBoard / wandb, samples
* ``main.py``        ``agentgym train`` and ``train(cfg, source=...)``

Configuration lives in ``configs/`` (see ``agentgym.config``).
"""
