"""The agent: ReAct loop, workspace, tools, SKILL.md, policies, trajectories."""
