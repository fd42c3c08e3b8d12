"""What runs around the RL loop: the stages of ``agentgym train`` and the commands that score, compare
and prepare models outside it.

* ``train_command.py`` ``agentgym train``: preflight, warm start, held-out scores, RL
                       (``agentgym.trainer.run.train``), the held-out table, the summary
* ``warm_start.py``    demos -> SFT before RL (the SFT model becomes the policy)
* ``sft.py``           ``agentgym sft`` (veRL's SFT trainer keys) on the trainer's workers;
                       ``sft_data.py`` chat data -> trajectories with the RL loss mask
* ``held_out.py``      success on seeds no stage trained on, before and after RL, and its table
* ``stage_cache.py``   a stage's output reused when the same settings made it
* ``offline/``         ``agentgym generate`` and ``agentgym eval data.path=`` (veRL's main_generation /
                       main_eval)
* ``config_command.py`` ``agentgym config --from SYSTEM FILE`` (translation: ``agentgym.compat``)
* ``run_dir.py``       a finished run on disk: its saved config and the model a path inside it stands for
* ``rollout_command.py``, ``eval_command.py``, ``serve_command.py`` ``agentgym rollout``, ``eval`` and
                       ``serve``: their flags, an embedded server when none is given
* ``from_run.py``      ``agentgym eval/rollout/serve --run DIR``: a run's settings under the flags given
* ``compare.py``       ``agentgym compare RUN ...``: held-out tables side by side (paired SE) and curves

Stages may use the trainer; the trainer never imports a stage.
"""
