"""agentgym.trainer"""
