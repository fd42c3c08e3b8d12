"""agentgym.interactions"""
