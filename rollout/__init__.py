"""The agent: ReAct loop, tools, SKILL.md, policies, trajectories."""
