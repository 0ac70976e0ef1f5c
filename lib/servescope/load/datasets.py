"""Prompts for the load generator: random text of an exact token length, using the served model's tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import SpecError


@dataclass(frozen=True)
class Prompt:
    """One request's input: text, its token count, and the output length asked for."""

    text: str
    input_tokens: int
    output_len: int
    exact: bool  # True when input_tokens was counted by the model's own tokenizer


def load_tokenizer(model_path: str | Path) -> Tokenizer | None:
    """The model's tokenizer from its folder (tokenizer.json), or None when the folder has none."""
    p = Path(model_path) / "tokenizer.json"
    return Tokenizer.from_file(str(p)) if p.is_file() else None


def _special_ids(tok: Tokenizer) -> set[int]:
    return {tok.token_to_id(t.content) for t in tok.get_added_tokens_decoder().values() if t.special} - {None}


def random_prompts(tok: Tokenizer | None, n: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """n prompts whose text re-encodes to exactly input_len tokens (random ids, decoded, re-encoded, trimmed)."""
    rng = random.Random(seed)
    if tok is None:
        # No tokenizer here (external server, hub id): words, about one token each; lengths come from usage.
        words = ["alpha", "beta", "gamma", "delta", "kernel", "graph", "token", "expert", "batch", "clock"]
        return [Prompt(" ".join(rng.choice(words) for _ in range(input_len)), input_len, output_len, False)
                for _ in range(n)]
    banned = _special_ids(tok)
    vocab = [i for i in range(tok.get_vocab_size()) if i not in banned]
    if not vocab:
        raise SpecError("tokenizer has no ordinary tokens to build prompts from")
    out: list[Prompt] = []
    for _ in range(n):
        for _attempt in range(50):
            ids = [rng.choice(vocab) for _ in range(input_len)]
            text = tok.decode(ids)
            for _fix in range(8):
                enc = tok.encode(text, add_special_tokens=False).ids
                if len(enc) == input_len:
                    break
                if len(enc) > input_len:
                    enc = enc[:input_len]
                else:
                    enc = enc + [rng.choice(vocab) for _ in range(input_len - len(enc))]
                text = tok.decode(enc)
            if len(tok.encode(text, add_special_tokens=False).ids) == input_len:
                out.append(Prompt(text, input_len, output_len, True))
                break
        else:
            raise SpecError(f"could not build a prompt of exactly {input_len} tokens with this tokenizer")
    return out
