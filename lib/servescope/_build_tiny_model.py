"""Build a seeded random-weight MoE model and a locally trained byte-level BPE tokenizer.

Runs as a script under the *engine's* interpreter (which has torch and transformers), so the model is
written by the same transformers that will load it: `python _build_tiny_model.py SPEC_JSON OUT_DIR`.
Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

# A few lines of text, enough for byte-level BPE merges; the weights are random, so content is irrelevant.
CORPUS = """\
The server takes requests, batches them, and runs the model one step at a time.
Each decode step launches many small kernels; when they are short, the GPU waits on the host.
CUDA graphs record a step once and replay it with a single launch.
Piecewise graphs keep attention inside the graph and run the experts eagerly.
A mixture of experts sends every token to a few experts chosen by a router.
Grouped GEMM runs the matrix products of many experts in one kernel.
Tensor parallelism splits each layer across GPUs; data parallelism copies the model.
Power below the limit at full clocks with high utilization means the GPU is stalled, not busy.
Throughput is tokens per second; latency is the time to the first token and between tokens.
Measure twice, compare medians, and state the spread.
""".splitlines()

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
    fast.save_pretrained(out)
    return fast


def _sha256(path: Path) -> str:
    """The file's digest, read in chunks: the weights are gigabytes (read whole, they doubled the build's memory)."""
    h = hashlib.sha256()
    with path.open("rb") as f:  # not hashlib.file_digest: the engine's interpreter may be older than 3.11
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def build(spec: dict, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(spec["vocab_size"], out)
    dtype = getattr(torch, spec["dtype"])
    config = AutoConfig.for_model(
        spec["architecture"],
        vocab_size=len(tok),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        moe_intermediate_size=spec["moe_intermediate_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        head_dim=spec["head_dim"],
        num_experts=spec["num_experts"],
        num_experts_per_tok=spec["top_k"],
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id if spec.get("stops_at_eos", True) else None,
        pad_token_id=tok.pad_token_id,
    )
    config.dtype = spec["dtype"]
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    if not spec.get("stops_at_eos", True):
        # random weights emit the end token early and at random; engines that cannot be told to ignore it
        # (transformers serve reads the generation config, then the model config) would measure short answers
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = None
    model.save_pretrained(out, safe_serialization=True)
    digests = {
        p.name: _sha256(p)
        for p in sorted(out.iterdir())
        if p.suffix in {".safetensors", ".json"} and p.name != "servescope-model.json"
    }
    import tokenizers
    import transformers

    meta = {
        "spec": spec,
        "vocab_size": len(tok),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "sha256": digests,
        "built_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                       "tokenizers": tokenizers.__version__},
    }
    (out / "servescope-model.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    build(json.loads(sys.argv[1]), Path(sys.argv[2]))
