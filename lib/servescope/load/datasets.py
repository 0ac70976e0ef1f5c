"""Prompts for the load generator: random text of an exact token length, a ShareGPT file, or a JSONL file."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import SpecError


@dataclass(frozen=True)
class Prompt:
    """One request's input: text (or chat messages), its token count, and the output length asked for."""

    text: str
    input_tokens: int
    output_len: int
    exact: bool  # True when input_tokens was counted by the model's own tokenizer
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs, for chat prompts from files


def load_tokenizer(model_path: str | Path) -> Tokenizer | None:
    """The model's tokenizer from its folder (tokenizer.json), or None when the folder has none."""
    p = Path(model_path) / "tokenizer.json"
    return Tokenizer.from_file(str(p)) if p.is_file() else None


def _special_ids(tok: Tokenizer) -> set[int]:
    return {tok.token_to_id(t.content) for t in tok.get_added_tokens_decoder().values() if t.special} - {None}


def _count(tok: Tokenizer | None, text: str) -> tuple[int, bool]:
    if tok is None:
        return len(text.split()), False  # words: an estimate; the server's usage gives the truth
    return len(tok.encode(text, add_special_tokens=False).ids), True


def random_prompts(tok: Tokenizer | None, n: int, input_len: int, output_len: int, seed: int,
                   lengths: list[tuple[int, int]] | None = None) -> list[Prompt]:
    """n prompts whose text re-encodes to exactly input_len tokens (random ids, decoded, re-encoded, trimmed); with
    lengths, prompt i has lengths[i] = (input tokens, output tokens) instead."""
    rng = random.Random(seed)
    sizes = lengths or [(input_len, output_len)] * n
    if tok is None:
        # No tokenizer here (external server, hub id): words, about one token each; lengths come from usage.
        words = ["alpha", "beta", "gamma", "delta", "kernel", "graph", "token", "expert", "batch", "clock"]
        return [Prompt(" ".join(rng.choice(words) for _ in range(i_len)), i_len, o_len, False) for i_len, o_len in sizes]
    banned = _special_ids(tok)
    vocab = [i for i in range(tok.get_vocab_size()) if i not in banned]
    if not vocab:
        raise SpecError("tokenizer has no ordinary tokens to build prompts from")
    out: list[Prompt] = []
    for input_len, output_len in sizes:
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


def sharegpt_prompts(path: str | Path, tok: Tokenizer | None, n: int, output_len: int | None, seed: int,
                     min_tokens: int = 4, max_input_tokens: int = 1024) -> list[Prompt]:
    """n conversations from a ShareGPT-format JSON file: the first human turn is the prompt; the reply's length is
    the output length unless output_len is given. Conversations too short or too long are skipped."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"cannot read ShareGPT file {path}: {e}") from None
    if not isinstance(data, list):
        raise SpecError(f"ShareGPT file {path} must hold a JSON list of conversations")
    rng = random.Random(seed)
    order = list(range(len(data)))
    rng.shuffle(order)
    out: list[Prompt] = []
    for i in order:
        conv = data[i].get("conversations") if isinstance(data[i], dict) else None
        if not conv or len(conv) < 2:
            continue
        human, reply = conv[0].get("value", ""), conv[1].get("value", "")
        n_in, exact = _count(tok, human)
        n_out = output_len if output_len is not None else _count(tok, reply)[0]
        if n_in < min_tokens or n_out < min_tokens or n_in > max_input_tokens:
            continue
        out.append(Prompt(human, n_in, n_out, exact))
        if len(out) == n:
            break
    if len(out) < n:
        raise SpecError(f"ShareGPT file {path} has only {len(out)} usable conversations; {n} asked for")
    return out


def jsonl_prompts(path: str | Path, tok: Tokenizer | None, n: int, output_len: int, seed: int) -> list[Prompt]:
    """n prompts from a JSONL file, one object a line: {"prompt": str} or {"messages": [{"role", "content"}]},
    optionally with "output_len" (or "max_tokens"). Lines are drawn in a seeded order, cycling if n is larger."""
    items: list[Prompt] = []
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as e:
        raise SpecError(f"cannot read JSONL file {path}: {e}") from None
    for ln, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}:{ln}: not JSON ({e})") from None
        out_len = int(obj.get("output_len") or obj.get("max_tokens") or output_len)
        if "messages" in obj:
            msgs = tuple((m["role"], m["content"]) for m in obj["messages"])
            text = "\n".join(c for _, c in msgs)
            n_in, exact = _count(tok, text)
            items.append(Prompt(text, n_in, out_len, exact, msgs))
        elif "prompt" in obj:
            n_in, exact = _count(tok, obj["prompt"])
            items.append(Prompt(obj["prompt"], n_in, out_len, exact))
        else:
            raise SpecError(f"{path}:{ln}: needs a 'prompt' or 'messages' field")
    if not items:
        raise SpecError(f"JSONL file {path} holds no prompts")
    rng = random.Random(seed)
    rng.shuffle(items)
    return [items[i % len(items)] for i in range(n)]
