"""pytest-agentcgroup: trace-driven resource-control experiments for AI-agent workloads."""
