"""The kernel environment: compile, verify, profile, guards, reward, pool."""
