"""vLLM's CPU build on this machine, in its own process: requested tokens, sampler logprobs, deterministic greedy."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from tests.chat_inputs import chat_ids, report_timing


VLLM_SCRIPT = r'''
import json, sys, time

def main(model_dir, prompt_ids):
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t1 = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=512, max_num_seqs=4,
              max_num_batched_tokens=512, enforce_eager=True, seed=0)
    t2 = time.perf_counter()
    prompt = TokensPrompt(prompt_token_ids=prompt_ids)

    def run(**kw):
        o = llm.generate([prompt], SamplingParams(max_tokens=16, **kw), use_tqdm=False)[0].outputs[0]
        lps = None
        if o.logprobs is not None:
            lps = [{str(k): v.logprob for k, v in step.items()} for step in o.logprobs]
        return {"token_ids": list(o.token_ids), "logprobs": lps, "finish_reason": o.finish_reason}

    t3 = time.perf_counter()
    result = {
        "sampled": run(temperature=1.0, seed=7, logprobs=1, ignore_eos=True),
        "sampled_again": run(temperature=1.0, seed=7, logprobs=1, ignore_eos=True),
        "sampled_no_logprobs": run(temperature=1.0, seed=7, ignore_eos=True),
        "greedy": run(temperature=0.0, logprobs=0, ignore_eos=True),
        "greedy_again": run(temperature=0.0, logprobs=0, ignore_eos=True),
    }
    t4 = time.perf_counter()
    result.update(import_s=t1 - t0, start_s=t2 - t1, generate_s=t4 - t3, tokens=5 * 16)
    print("RESULT " + json.dumps(result), flush=True)

if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
'''


def test_vllm_cpu_engine_returns_requested_tokens_with_logprobs_and_greedy_is_deterministic(tiny_model_dir, tmp_path, capsys):
    """A real vLLM engine, in its own process: vLLM binds OpenMP threads, sets torch's thread
    count and global seeds, and initialises torch.distributed, none of which may leak into the
    other tests. The engine core runs in that process (no second spawn, which re-imports vLLM):
    import + start ~16 s instead of ~45 s on 2 cores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt_ids = chat_ids(tokenizer)
    script = tmp_path / "run_vllm.py"
    script.write_text(VLLM_SCRIPT)
    env = dict(os.environ)
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # engine core in-process: saves a spawn + re-import
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache; the default takes a large share of RAM
        # The model runs eager (enforce_eager), but the sampler's logprob-rank op is decorated with
        # torch.compile: on a machine with a cold inductor cache the first logprobs request pays a
        # ~15-20 s C++ compile. Without dynamo it runs eagerly, with the same results.
        TORCHDYNAMO_DISABLE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), json.dumps(prompt_ids)],
        env=env, capture_output=True, text=True, timeout=420,
    )
    wall = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    r = json.loads(lines[-1].removeprefix("RESULT "))
    report_timing(capsys, f"vLLM-cpu: import {r['import_s']:.1f}s, engine start {r['start_s']:.1f}s, "
                    f"{r['tokens']} tokens in {r['generate_s']:.2f}s, subprocess wall {wall:.1f}s")

    vocab = len(tokenizer)
    sampled = r["sampled"]
    assert len(sampled["token_ids"]) == 16 and sampled["finish_reason"] == "length"
    assert all(0 <= t < vocab for t in sampled["token_ids"])
    assert len(sampled["logprobs"]) == 16
    for token, step in zip(sampled["token_ids"], sampled["logprobs"]):
        assert str(token) in step and 1 <= len(step) <= 2  # the sampled token, plus the top-1
        assert all(math.isfinite(v) and v <= 0.0 for v in step.values())
    assert r["sampled_again"]["token_ids"] == sampled["token_ids"], "a fixed per-request seed must reproduce"
    assert r["sampled_no_logprobs"]["token_ids"] == sampled["token_ids"]
    assert r["sampled_no_logprobs"]["logprobs"] is None

    greedy = r["greedy"]
    assert len(greedy["token_ids"]) == 16 and greedy["token_ids"] == r["greedy_again"]["token_ids"]
    assert [len(step) for step in greedy["logprobs"]] == [1] * 16  # logprobs=0: the chosen token only

    # The engine runs the same weights as transformers: same first greedy token, same logprob.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0, -1], dim=-1)
    first = greedy["token_ids"][0]
    assert first == int(logprobs.argmax())
    assert greedy["logprobs"][0][str(first)] == pytest.approx(float(logprobs[first]), abs=1e-3)
