"""Task formats the field uses, read from local files into ``WorkspaceTask``s: Harbor / Terminal-Bench task
directories (``harbor.py``) and SWE-bench-style instances (``swebench.py``)."""


class UnsupportedTask(ValueError):
    """A task agentgym cannot run as a workspace task (it needs a container, the network, ...); the message says
    why."""
