"""The `cuda-agent` command line, drivers, reports and job submission."""
