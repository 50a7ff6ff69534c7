"""The kernel environment: workspace, compile, verify, profile, guards, reward, pool."""
