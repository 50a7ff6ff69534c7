"""The kernel environment, in rooms along its trust boundary.

    pool.py, evaluate.py, reward.py   the worker: EnvWorker (the Ray actor), one evaluation, the milestone reward;
                                      answer_check.py (the learning check's verifier), device_watch.py,
                                      reference_profile.py and ncu.py (what the agent's tools ask of it)
    trusted/     the harness process: the request (harness_request), the verdict and task cache (harness),
                 the round protocol and its timing (round_protocol), servers started ahead (server_pool),
                 which code ran (code_sampler), verification (verify), outputs read (readout), baselines
    candidate/   what runs in the candidate's sandboxed process: the model server (serve), the import and
                 ncu children (runner), in-process guards and the seccomp filter
    build/       compiles: the fast path (compile), load_inline's nvcc (nvcc_light, nvcc_split), the
                 precompiled header (inline_pch), the paper's layout, the GPU's architecture
    isolation/   the OS sandbox (sandbox, its shim, watchdog, channels, cgroups, result channel) and
                 the host's pressure
    shared/      the round memory both sides map (rounds, arena), input sets, timing helpers

trusted/ may use candidate/'s constants; candidate/ never imports trusted/ (pyproject.toml's
second import contract).
"""
