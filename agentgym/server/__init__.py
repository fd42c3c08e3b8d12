"""agentgym.server"""
