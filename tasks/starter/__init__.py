"""The starter set: 35 KernelBench-style problems, each sized per backend by its PRESETS.

The cpp presets keep the eager reference within 1-50 ms on one core of a small CPU machine
(tests/test_tasks.py holds them there). The cuda presets were sized on an H100 on 2026-11-27 by
scripts/size_starter_tasks.py to 1.6-4.0 ms eager (the LSTM, whose time follows its sequence, kept
at 12 ms), inside the paper's 1-100 ms window, so that every starter task's speed is judged there:
at the earlier sizes most ran in 0.1-0.4 ms, within the timing protocol's noise.
"""
