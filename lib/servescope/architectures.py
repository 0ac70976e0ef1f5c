"""Real model architectures without their weights: a shipped config.json (written from the published configuration
values) and a tokenizer made here, served with the engine's own seeded random weights (`--load-format dummy`).

Speed is representative of the real model (the same shapes, the same kernels); outputs are not (the weights are
random). Nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import SpecError
from .paths import cache_root, project_root
from .util import file_lock

if TYPE_CHECKING:
    from .spec import ModelSpec

META = "servescope-model.json"
# bumped when the folder servescope writes for an architecture changes (its tokenizer), so caches are rebuilt
BUILD_VERSION = 1
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


def architectures_dir() -> Path:
    """Where the shipped architectures live: one folder each, holding its config.json."""
    return project_root() / "data" / "architectures"


def shipped() -> list[str]:
    """Names of the architectures this checkout ships."""
    root = architectures_dir()
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def config_path(name: str) -> Path:
    """The config.json of a shipped architecture (by name) or of a folder given by path; SpecError naming the shipped
    ones where there is none."""
    p = Path(name).expanduser()
    cand = p / "config.json" if ("/" in name or p.is_dir()) else architectures_dir() / name / "config.json"
    if not cand.is_file():
        raise SpecError(f"model.architecture {name!r}: no config.json at {cand}; shipped architectures: "
                        f"{', '.join(shipped()) or 'none'}")
    return cand


def read_config(name: str) -> dict[str, Any]:
    """The architecture's config, validated enough to serve and size it."""
    path = config_path(name)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"model.architecture {name!r}: {path} cannot be read ({e})") from None
    missing = [k for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if k not in cfg]
    if missing:
        raise SpecError(f"model.architecture {name!r}: {path} lacks {', '.join(missing)}")
    return cfg


def config_digest(name: str) -> str:
    """A short hash of the architecture's config and of how servescope builds its folder (the store key names it: a
    changed config is another model)."""
    raw = json.dumps({"config": read_config(name), "build": BUILD_VERSION}, sort_keys=True).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


def model_key(model: ModelSpec) -> dict[str, Any]:
    """The model as store keys name it (a tiny model in full: it is the model; an architecture with its config's
    digest, so that a changed config is another model)."""
    key = model.model_dump(mode="json", exclude_none=True)
    if model.architecture is not None:
        key["config"] = config_digest(model.architecture)
    return key


@dataclass(frozen=True)
class Size:
    """What an architecture weighs, estimated from its config (norms and biases left out: under 0.1%)."""

    params: int
    active_params: int  # per token: attention, embeddings, the routed experts' top-k and any shared expert
    dtype: str
    kv_bytes_per_token: int  # K and V of every layer, in the model's dtype

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weights in the model's dtype."""
        return self.params * _BYTES.get(self.dtype, 2)

    def words(self) -> str:
        """'30.5B parameters (3.3B active), 61.1 GB in bfloat16'."""
        n = lambda x: f"{x / 1e9:.1f}B" if x >= 1e9 else f"{x / 1e6:.1f}M"  # noqa: E731
        gb = self.weights_bytes / 1e9
        return (f"{n(self.params)} parameters ({n(self.active_params)} active per token), "
                + (f"{gb:.1f} GB" if gb >= 1 else f"{self.weights_bytes / 1e6:.0f} MB") + f" in {self.dtype}")


def size(cfg: dict[str, Any]) -> Size:
    """Parameters, active parameters and KV bytes per token of a decoder config (dense, or MoE in the Qwen-MoE,
    Mixtral and DeepSeek spellings)."""
    h, layers, heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    vocab = int(cfg["vocab_size"])
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    experts = int(next((cfg[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)), 0))
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    dense_ffn = 3 * h * int(cfg.get("intermediate_size") or 0)
    if experts > 1:
        # Mixtral's experts are intermediate_size wide; Qwen-MoE and DeepSeek give moe_intermediate_size
        e_ffn = 3 * h * int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
        shared = 3 * h * int(cfg.get("shared_expert_intermediate_size") or 0) + \
            3 * h * int(cfg.get("moe_intermediate_size") or 0) * int(cfg.get("n_shared_experts") or 0)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        moe_layers = [i for i in range(layers) if i not in dense_only and (i + 1) % step == 0 and i >= first_dense]
        n_moe = len(moe_layers)
        ffn = n_moe * (experts * e_ffn + h * experts + shared) + (layers - n_moe) * dense_ffn
        ffn_active = n_moe * (top_k * e_ffn + h * experts + shared) + (layers - n_moe) * dense_ffn
    else:
        ffn = ffn_active = layers * dense_ffn
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    total = embed + layers * attn + ffn
    active = embed + layers * attn + ffn_active
    return Size(total, active, dtype, 2 * layers * kv * hd * _BYTES.get(dtype, 2))


def describe(name: str) -> str:
    """The words every page says of a model served from its architecture alone."""
    cfg = read_config(name)
    return (f"random weights of the {label(name)} architecture ({size(cfg).words()}; the engine's own seeded random "
            "weights, nothing downloaded): speed is representative, outputs are not")


def label(name: str) -> str:
    """A shipped architecture's display name ('Qwen3-30B-A3B'), else the folder's name."""
    return {"qwen3-30b-a3b": "Qwen3-30B-A3B", "mixtral-8x7b": "Mixtral-8x7B",
            "tiny-qwen3-moe": "tiny Qwen3-MoE (4 layers)"}.get(name, Path(name).name)


def model_dir(name: str) -> Path:
    """The cache folder servescope serves an architecture from (config and tokenizer, no weights)."""
    return cache_root() / "models" / f"arch-{Path(name).name}-{config_digest(name)}"


def ensure_model(name: str) -> Path:
    """The architecture's folder, built once (under a lock, atomically): its config.json as shipped and a tokenizer
    made here whose vocabulary has exactly the config's size (a byte-level BPE trained on a few lines, padded with
    ordinary tokens), so every id the random weights emit decodes."""
    target = model_dir(name)
    if (target / META).is_file():
        return target
    cfg = read_config(name)
    with file_lock(target.parent / f".{target.name}.lock"):
        if (target / META).is_file():
            return target
        tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        write_tokenizer(int(cfg["vocab_size"]), tmp)
        s = size(cfg)
        (tmp / META).write_text(json.dumps({"architecture": name, "weights": "engine random (--load-format dummy)",
                                            "num_parameters": s.params, "active_parameters": s.active_params,
                                            "weights_bytes": s.weights_bytes, "dtype": s.dtype,
                                            "kv_bytes_per_token": s.kv_bytes_per_token,
                                            "spec": {"stops_at_eos": False}}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    return target


def write_tokenizer(vocab_size: int, out: Path) -> None:
    """A byte-level BPE tokenizer of exactly vocab_size ids, with a chat template, in the files engines read."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from ._build_tiny_model import CHAT_TEMPLATE, CORPUS, SPECIALS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 512), special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    have = tok.get_vocab_size()
    if have > vocab_size:
        raise SpecError(f"a vocabulary of {vocab_size} is smaller than the tokenizer's byte alphabet ({have})")
    # ordinary (not special) tokens: they decode to their text and random prompts may use them
    tok.add_tokens([AddedToken(f"<|w{i}|>", normalized=False, special=False) for i in range(vocab_size - have)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[2],
        "pad_token": SPECIALS[0], "unk_token": None, "chat_template": CHAT_TEMPLATE, "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": SPECIALS[0], "eos_token": SPECIALS[2], "pad_token": SPECIALS[0]}, indent=2))
