"""Other systems' configs in agentgym: what each key of veRL, ROLL, ChatLearn and Claw-R1 becomes here.
Translation only: nothing of the RL loop is imported here.

* ``verl.py``: veRL's ``ppo_trainer.yaml`` keys that agentgym's ``train.yaml`` lacks, each accepted with
  no effect (and why), refused (and what to use instead), or an alias of an agentgym key. A veRL
  command line runs as written: ``agentgym.trainer.config.load_config`` consults these rules.
* ``agentgym config --from``, which translates a file and loads the result, is
  ``agentgym.stages.config_command``.
* ``roll.py``, ``chatlearn.py``, ``claw_r1.py``: translators from those systems' YAML files to
  agentgym's config (``agentgym config --from SYSTEM FILE``).
* ``config_notes.py``: warnings about keys a composed config sets that nothing reads or that have no effect
  under the chosen settings (``critic.*`` under GRPO, engine knobs for the embedded server, ...).
* ``verl_sft.py``: veRL's ``sft_trainer.yaml`` keys ``configs/sft.yaml`` lacks (``agentgym sft``'s key policy).
* ``command_line.py``: whose a file or a command-line key is (ROLL, ChatLearn, Claw-R1, a Hydra-composed or
  dumped veRL config), so ``agentgym train`` translates their launch scripts as ``config --from`` does.
* ``rules.py``: the ``Rule`` type the tables are written in; ``docs.py`` renders them into the
  "coming from X" pages, so the pages cannot drift from the code.
"""

from agentgym.compat.rules import Rule, Verdict, apply_rules

__all__ = ["Rule", "Verdict", "apply_rules"]
