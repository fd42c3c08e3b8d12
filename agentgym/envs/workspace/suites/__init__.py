"""Task suites for workspace envs: each is a task source, a callable ``seed -> WorkspaceTask``.

* ``terminal``: generated shell chores over a generated file tree (find, count, grep, move, extract, fix a config).
* ``swe``: generated small Python packages with an injected bug and failing tests (SWE-smith style).

Seeds are the split, as for Sokoban: the same seed gives the same task, training draws seeds from
``env.train_seed_start`` and the held-out table from ``env.val_seed_start`` (never trained on).
"""
