"""The Ray PPO trainer: ``agentgym train``.

A map, in the order a step touches them:

* ``config.py``       the training config's meaning: defaults that follow from others, choices,
                      batch arithmetic (``load_config``)
* ``sources.py``      where trajectories come from (``TrajectorySource``: env rollouts, fixed
                      batches, the gateway's agents) and the data order (``TaskSampler``)
* ``batch.py``        trajectories -> padded tensors; mini-batch plans shared by all ranks
* ``algos/``          the maths: advantage estimators, policy/value/KL losses, aggregation (veRL's names)
* ``flat_rewards.py`` groups whose rewards are all equal (zero advantages), counted and warned about
* ``workers.py``      actor (+ reference) and critic workers; ``forward.py`` their forward passes;
                      ``train_state.py`` model + optimizer per rank (FSDP2 or gloo data-parallel);
                      ``worker_group.py`` N ranks as Ray actors or in-process
* ``weight_sync.py``  the rollout side's policy servers and pushing new weights to them
* ``ppo_trainer.py``  the single-controller loop (``PPOTrainer``)
* ``checkpoint.py``   veRL's ``global_step_N`` layout and resuming
* ``loggers.py``      progress line, console / JSONL / TensorBoard / wandb, samples
* ``main.py``         ``agentgym train`` and ``train(cfg, source=...)``

Configuration lives in ``configs/``: composed by ``agentgym.config``, given its meaning by
``agentgym.trainer.config``.
"""
