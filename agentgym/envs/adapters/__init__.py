"""Environments from other ecosystems, each an optional extra and an ``agentgym.envs`` family.

* ``rg/<task>`` (``agentgym[reasoning-gym]``): any reasoning-gym dataset, single turn, scored
  by the dataset's own ``score_answer`` (``reasoning_gym.py``).
* ``ta/<game>`` (``agentgym[textarena]``): TextArena games; one-player directly, two-player
  against a fixed opponent or in self-play (``textarena.py``).
* ``vf/<module>`` (``agentgym[verifiers]``): a verifiers environment module's
  ``load_environment``, its rubric as the reward (``verifiers.py``).
* ``openenv`` (``agentgym[openenv]`` for the tests only): a client env that steps any running
  OpenEnv server (``openenv_client.py``); ``agentgym env-serve`` serves any agentgym env with
  OpenEnv's HTTP/WebSocket API (``openenv_server.py``).

Nothing here imports the ecosystem's package at import time: ``agentgym envs`` stays fast and
lists each family as one row, installed or not.
"""
