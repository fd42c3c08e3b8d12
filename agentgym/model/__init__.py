"""agentgym.model"""
