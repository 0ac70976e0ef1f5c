"""Tiny-model factory: a seeded random-weight MoE written to the per-user cache, nothing downloaded."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .errors import ServescopeError, SpecError
from .paths import cache_root
from .spec import ModelSpec, TinyModelSpec
from .util import file_lock

log = logging.getLogger(__name__)

META = "servescope-model.json"


def tiny_model_dir(spec: TinyModelSpec) -> Path:
    """Cache folder of a tiny model, keyed by the hash of its spec."""
    return cache_root() / "models" / f"tiny-moe-{spec.digest()}"


def tiny_model_ready(spec: TinyModelSpec | None) -> bool:
    """Whether a generated model is already built (nothing to generate)."""
    return spec is not None and (tiny_model_dir(spec) / META).is_file()


def ensure_tiny_model(spec: TinyModelSpec, python: str | os.PathLike[str] | None = None,
                      python_env: dict[str, str] | None = None) -> Path:
    """Build the model once (under a lock, atomically) with an interpreter (and its own environment) that has
    torch+transformers."""
    target = tiny_model_dir(spec)
    if (target / META).is_file():
        return target
    with file_lock(target.parent / f".{target.name}.lock"):
        if (target / META).is_file():
            return target
        tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        script = Path(__file__).with_name("_build_tiny_model.py")
        cmd = [str(python or sys.executable), str(script), json.dumps(spec.model_dump(mode="json")), str(tmp)]
        t0 = time.monotonic()
        env = {**os.environ, **(python_env or {}), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ServescopeError(f"tiny model build failed ({res.returncode}):\n{res.stderr[-3000:]}")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        log.info("built tiny model %s in %.1f s", target, time.monotonic() - t0)
    return target


def model_info(path: str | os.PathLike[str]) -> dict:
    """The metadata a generated model carries, or {} for a foreign model."""
    p = Path(path) / META
    return json.loads(p.read_text()) if p.is_file() else {}


def resolve_model(model: ModelSpec, python: str | os.PathLike[str] | None,
                  python_env: dict[str, str] | None = None) -> tuple[str, str]:
    """(path or hub id to serve, name the server exposes it as)."""
    if model.tiny is not None:
        path = str(ensure_tiny_model(model.tiny, python, python_env))
        return path, model.served_name or f"tiny-moe-{model.tiny.digest()}"
    if model.architecture is not None:
        from .architectures import ensure_model

        path = str(ensure_model(model.architecture))
        return path, model.served_name or Path(path).name
    assert model.path is not None
    check_model_path(model.path)
    return model.path, model.served_name or model.path


def check_model_path(path: str) -> None:
    """A local model path must be a folder with a readable config.json; anything else not on disk is taken as a
    hub id the user named ('org/name'). Raises SpecError with what is wrong."""
    p = Path(path).expanduser()
    local = path.startswith(("/", "./", "../", "~")) or p.exists()
    if not local:
        return
    if not p.exists():
        raise SpecError(f"model.path {path!r} does not exist (a local path must be a folder with config.json; a hub "
                        "id is written org/name)")
    cfg = p / "config.json" if p.is_dir() else None
    if cfg is None or not cfg.is_file():
        raise SpecError(f"model.path {path!r} is not a model folder: no config.json in it")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"model.path {path!r}: config.json cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not ({"model_type", "architectures"} & set(data)):
        raise SpecError(f"model.path {path!r}: config.json names neither model_type nor architectures")


def model_config(path: str) -> dict[str, Any]:
    """A local model folder's config.json, the text model's part merged over it for multimodal configs ({} where
    there is none to read)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return {**cfg, **text}


def config_dtype(path: str) -> str | None:
    """The dtype a local model folder's config.json declares ('bfloat16'), or None where it says none or is not here."""
    cfg = model_config(path)
    d = cfg.get("dtype") or cfg.get("torch_dtype")
    return short_dtype(d) if d else None


def short_dtype(value: object) -> str:
    """'torch.bfloat16' -> 'bfloat16'."""
    return str(value).removeprefix("torch.")


EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token")


def is_moe(path: str) -> bool:
    """Whether a local model folder's config.json describes a mixture of experts (False where it cannot tell)."""
    cfg = model_config(path)
    return any((cfg.get(k) or 0) > 1 for k in EXPERT_KEYS)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weights_bytes(path: str) -> int | None:
    """Bytes of the weight files of a model folder (what each server loads onto its GPU), or None where the model
    is not a local folder (a hub id) or holds no weight file."""
    p = Path(path)
    if not p.is_dir():
        return None
    if (info := model_info(p)).get("weights_bytes"):  # an architecture alone: the engine makes weights of this size
        return int(info["weights_bytes"])
    total = sum(f.stat().st_size for f in p.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    return total or None
