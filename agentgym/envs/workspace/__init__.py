"""Environments where an agent works in a computer: a sandboxed workspace that lives for one episode,
shell and editor tools, a verifier the agent cannot touch, and task suites (terminal chores, SWE bug fixes,
Harbor / SWE-bench task formats)."""
