"""Does a configuration answer as the baseline does? Every launched configuration answers a fixed, seeded set of
prompts of several lengths (spanning the engines' prefill batch buckets) with teacher-forced prompt log-probabilities
and a short greedy continuation, once one prompt at a time and once all at once. A faster configuration is only a
fix if it answers the same: its deviation from the baseline is judged against the baseline's own noise (its two
launches, and each launch's answers alone against batched), never against zero.

Measuring (take) runs on a live server; judging (verdict) is a pure function of the stored tables."""

from __future__ import annotations

import concurrent.futures
import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .load.datasets import Prompt, random_prompts

# prompt tokens of the check set: short to long, across the engines' prefill graph buckets (SGLang captures prefill
# batches up to --cuda-graph-max-bs-prefill tokens; vLLM up to its largest capture size); a deployment serving
# shorter contexts drops the lengths it cannot hold
CHECK_LENGTHS = (5, 31, 130, 515, 1100, 2050)
GREEDY_TOKENS = 8
CHECK_SEED = 4242
# a configuration "changes outputs" where its mean teacher-forced log-probability difference from the baseline (per
# prompt, the largest prompt's) exceeds FLOOR_FACTOR x the baseline's own (its launches against each other, each
# launch alone against batched), REL_TOL x the spread of the baseline's log-probabilities, and ABS_FLOOR nats.
# REL_TOL: kernels that order bf16 sums otherwise move log-probabilities by about 0.5% of their spread (the embedded
# engine's compiled against eager launches: 0.0011 nats on average, 0.0136 at most, against a 0.2-nat spread, on a
# batch-invariant engine whose own floor is 0), while wrong answers (garbled, memory reused) move them by about
# their whole spread
FLOOR_FACTOR = 4.0
REL_TOL = 0.05
ABS_FLOOR = 1e-5
# a baseline whose prompt log-probabilities spread less than this (nats) answers near-uniformly: random weights
NEAR_UNIFORM = 1e-3
CHECK_COLUMNS = ["pass", "prompt", "prompt_tokens", "kind", "position", "token_id", "logprob"]


class CheckUnavailable(Exception):
    """This engine (or server) gives no log-probabilities servescope can read: outputs are not verified."""


def check_prompts(tokenizer: Any, max_len: int | None = None) -> list[Prompt]:
    """The check set: one seeded random prompt per length (the same on every launch of one model)."""
    lengths = [n for n in CHECK_LENGTHS if max_len is None or n + GREEDY_TOKENS <= max_len]
    return random_prompts(tokenizer, len(lengths), 1, GREEDY_TOKENS, CHECK_SEED,
                          lengths=[(n, GREEDY_TOKENS) for n in lengths])


def _post(url: str, body: dict[str, Any], api_key: str | None, timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"}
                                 | ({"Authorization": f"Bearer {api_key}"} if api_key else {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise CheckUnavailable(f"HTTP {e.code} from {url}: {(e.read() or b'').decode(errors='replace')[:300]}") from None


def take(adapter: Any, base_url: str, model: str, prompts: list[Prompt], api_key: str | None = None,
         timeout_s: float = 300.0) -> pd.DataFrame:
    """Every check prompt's answer, one at a time ('alone') and then all at once ('batched'), as a tidy table
    (CHECK_COLUMNS); CheckUnavailable where the engine gives no log-probabilities."""
    path, _ = adapter.output_check_request(model, prompts[0].text, GREEDY_TOKENS)
    url = base_url.rstrip("/") + path

    def one(i: int) -> list[dict[str, Any]]:
        _, body = adapter.output_check_request(model, prompts[i].text, GREEDY_TOKENS)
        prompt_lp, out_ids, out_lp = adapter.output_check_parse(_post(url, body, api_key, timeout_s))
        rows = [{"prompt": i, "prompt_tokens": prompts[i].input_tokens, "kind": "prompt", "position": p,
                 "token_id": -1, "logprob": lp} for p, lp in enumerate(prompt_lp) if lp is not None]
        rows += [{"prompt": i, "prompt_tokens": prompts[i].input_tokens, "kind": "output", "position": p,
                  "token_id": int(t), "logprob": lp} for p, (t, lp) in enumerate(zip(out_ids, out_lp, strict=False))]
        if not any(r["kind"] == "prompt" for r in rows):
            raise CheckUnavailable(f"{adapter.name} returned no prompt log-probabilities")
        return rows

    rows = []
    for i in range(len(prompts)):
        rows += [r | {"pass": "alone"} for r in one(i)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        for got in ex.map(one, range(len(prompts))):
            rows += [r | {"pass": "batched"} for r in got]
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def deviation(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per check prompt: the mean and the largest difference of teacher-forced prompt log-probabilities between two
    answers, and the first greedy position where their continuations part (-1: none)."""
    out = []
    for i, ga in a.groupby("prompt"):
        gb = b[b["prompt"] == i]
        pa, pb = (g[g["kind"] == "prompt"].set_index("position")["logprob"] for g in (ga, gb))
        common = pa.index.intersection(pb.index)
        diff = np.abs(pa[common].to_numpy() - pb[common].to_numpy())
        oa, ob = (g[g["kind"] == "output"].sort_values("position")["token_id"].tolist() for g in (ga, gb))
        part = next((k for k, (x, y) in enumerate(zip(oa, ob, strict=False)) if x != y), -1)
        out.append({"prompt": int(i), "prompt_tokens": int(ga["prompt_tokens"].iloc[0]),
                    "mean_logprob_dev": float(diff.mean()) if len(diff) else math.nan,
                    "max_logprob_dev": float(diff.max()) if len(diff) else math.nan,
                    "greedy_parts_at": part, "compared_positions": len(common)})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class OutputVerdict:
    """One configuration's answers against the baseline's: 'same' (within the noise floor), 'changes outputs', or
    'not verified' (a side has no check, or no floor could be measured), with the numbers that decided it."""

    config: str
    baseline: str
    status: str
    mean_dev: float = math.nan  # the largest prompt's mean difference: what is judged
    max_dev: float = math.nan
    floor: float = math.nan
    threshold: float = math.nan
    at_prompt_tokens: int | None = None
    greedy_parts_at: int = -1
    why: str = ""
    spread: float = math.nan  # std of the baseline's prompt log-probabilities: how much signal the check had

    @property
    def changes_outputs(self) -> bool:
        """Its answers differ from the baseline's beyond the noise."""
        return self.status == "changes outputs"

    def words(self) -> str:
        """The verdict in one sentence."""
        if self.status == "not verified":
            return f"outputs not verified: {self.why}"
        nums = (f"teacher-forced log-probabilities differ by {self.mean_dev:.3g} nats on average at a "
                f"{self.at_prompt_tokens}-token prompt ({self.max_dev:.3g} at most), against a tolerance of "
                f"{self.threshold:.3g} (the baseline's own noise {self.floor:.3g}; its log-probabilities spread "
                f"{self.spread:.2g} nats)"
                + (": random weights leave them near-uniform, so only differences above the tolerance are seen"
                   if self.spread < NEAR_UNIFORM else ""))
        if self.status == "same":
            return f"answers as {self.baseline} does ({nums})"
        greedy = f"; greedy continuation parts at token {self.greedy_parts_at + 1}" if self.greedy_parts_at >= 0 else ""
        return f"changes outputs against {self.baseline} ({nums}{greedy})"

    def row(self) -> dict[str, Any]:
        """For tables."""
        return {"config": self.config, "against": self.baseline, "outputs": self.status,
                "mean_logprob_dev": self.mean_dev, "max_logprob_dev": self.max_dev, "noise_floor": self.floor,
                "threshold": self.threshold, "logprob_spread": self.spread,
                "at_prompt_tokens": self.at_prompt_tokens, "greedy_parts_at": self.greedy_parts_at, "why": self.why}


def _passes(checks: pd.DataFrame, config: str) -> dict[int, dict[str, pd.DataFrame]]:
    c = checks[checks["config"] == config]
    return {int(r): {p: g for p, g in gr.groupby("pass")} for r, gr in c.groupby("rep")}


def noise_floor(checks: pd.DataFrame, configs: list[str]) -> tuple[float, str]:
    """The largest mean deviation among answers that must agree: each launch's answers alone against batched, and the
    first configuration's launches against each other (alone). NaN with the reason where nothing could be compared."""
    devs = []
    for cfg in configs:
        by_rep = _passes(checks, cfg)
        for passes in by_rep.values():
            if {"alone", "batched"} <= set(passes):
                devs.append(deviation(passes["alone"], passes["batched"])["mean_logprob_dev"].max())
    base = _passes(checks, configs[0])
    reps = sorted(r for r, p in base.items() if "alone" in p)
    if len(reps) >= 2:
        devs.append(deviation(base[reps[0]]["alone"], base[reps[1]]["alone"])["mean_logprob_dev"].max())
    devs = [d for d in devs if not math.isnan(d)]
    if not devs:
        return math.nan, "no launch answered the check set both alone and batched"
    return float(max(devs)), ""


def verdict(checks: pd.DataFrame, baseline: str, config: str) -> OutputVerdict:
    """config's answers (each launch, alone) against the baseline's first launch (alone): beyond the tolerance (the
    noise floor of both, REL_TOL of the baseline's spread, ABS_FLOOR)?"""
    if checks.empty or "config" not in checks:
        return OutputVerdict(config, baseline, "not verified", why="no launch answered the check set")
    mine, theirs = _passes(checks, config), _passes(checks, baseline)
    if not theirs or not mine:
        missing = baseline if not theirs else config
        return OutputVerdict(config, baseline, "not verified", why=f"{missing} has no answers to the check set")
    floor, why = noise_floor(checks, [baseline, config])
    if math.isnan(floor):
        return OutputVerdict(config, baseline, "not verified", why=why)
    ref = theirs[min(theirs)]["alone"]
    worst = None
    for _, passes in sorted(mine.items()):
        if "alone" not in passes:
            continue
        d = deviation(ref, passes["alone"])
        top = d.loc[d["mean_logprob_dev"].idxmax()]
        if worst is None or top["mean_logprob_dev"] > worst["mean_logprob_dev"]:
            worst = top
    if worst is None:
        return OutputVerdict(config, baseline, "not verified", why=f"{config} answered no check prompt alone")
    spread = float(ref.loc[ref["kind"] == "prompt", "logprob"].std())
    threshold = max(FLOOR_FACTOR * floor, REL_TOL * spread, ABS_FLOOR)
    status = "changes outputs" if worst["mean_logprob_dev"] > threshold else "same"
    return OutputVerdict(config, baseline, status, float(worst["mean_logprob_dev"]), float(worst["max_logprob_dev"]),
                         floor, threshold, int(worst["prompt_tokens"]), int(worst["greedy_parts_at"]), spread=spread)
