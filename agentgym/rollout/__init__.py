"""agentgym.rollout"""
