"""Bring results of the engines' own benchmark clients into servescope's summary schema.

`vllm bench serve --save-result` writes one JSON object; `python -m sglang.bench_serving --output-file` appends
one JSON object per run to a JSONL file. Both name latencies `{mean,median,std,pNN}_{metric}_ms`; vLLM says
`e2el`, SGLang `e2e_latency`. Per-request arrays (vLLM --save-detailed, SGLang --output-details) become request
records too. Field names: ../shared/knob-catalogue.md section 9.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import SpecError
from .metrics import LATENCIES, PCTS

_LAT = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e_latency)_ms$")
_METRIC = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms", "e2e_latency": "e2e_ms"}


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def _summary_row(d: dict[str, Any], source: str) -> dict[str, Any]:
    duration = _num(d.get("duration"))
    completed = d.get("completed")
    failed = d.get("failed")
    if failed is None and "num_prompts" in d and completed is not None:
        failed = int(d["num_prompts"]) - int(completed)
    if failed is None and isinstance(d.get("errors"), list):
        failed = sum(1 for e in d["errors"] if e)
    rate = d.get("request_rate")
    cap = d.get("max_concurrency")
    row: dict[str, Any] = {
        "source": source,
        "point": f"c={cap}" if cap not in (None, "") else f"rate={rate}",
        "mode": "closed" if cap not in (None, "") and str(rate) in ("inf", "Infinity", "None") else "open",
        "concurrency": int(cap) if cap not in (None, "") else None,
        "request_rate": _num(rate) if rate not in (None, "trace") else float("nan"),
        "completed": int(completed) if completed is not None else None,
        "failed": int(failed) if failed is not None else None,
        "duration_s": duration,
        "request_s": _num(d.get("request_throughput")),
        "input_tok_s": _num(d.get("input_throughput", _num(d.get("total_input_tokens")) / duration if duration else None)),
        "output_tok_s": _num(d.get("output_throughput")),
        "total_tok_s": _num(d.get("total_token_throughput", d.get("total_throughput"))),
        "achieved_concurrency": _num(d.get("concurrency")) if source.startswith("sglang") else float("nan"),
        "goodput_req_s": _num(d.get("request_goodput")),
        "label": d.get("label") or d.get("tag") or "",
    }
    if math.isnan(row["total_tok_s"]) and not math.isnan(row["input_tok_s"]):
        row["total_tok_s"] = row["input_tok_s"] + row["output_tok_s"]
    for name in LATENCIES:
        row[f"{name}_mean"] = float("nan")
        for p in PCTS:
            row[f"{name}_p{p}"] = float("nan")
    for k, v in d.items():
        m = _LAT.match(k)
        if not m:
            continue
        stat, metric = m.groups()
        col = _METRIC[metric]
        if stat == "mean":
            row[f"{col}_mean"] = _num(v)
        elif stat == "median":
            row[f"{col}_p50"] = _num(v)
        elif stat.startswith("p") and float(stat[1:]) in PCTS:
            row[f"{col}_p{int(float(stat[1:]))}"] = _num(v)
    return row


def _request_rows(d: dict[str, Any], source: str, point: str) -> list[dict[str, Any]]:
    """Per-request arrays (seconds in both clients) as servescope request records."""
    ttfts = d.get("ttfts")
    if not isinstance(ttfts, list):
        return []
    n = len(ttfts)
    itls = d.get("itls") or [[] for _ in range(n)]
    ins = d.get("input_lens") or [None] * n
    outs = d.get("output_lens") or [None] * n
    errs = d.get("errors") or [""] * n
    lat = d.get("latencies") or [None] * n
    # vLLM's start_times are perf_counter readings, not wall-clock times: kept only when they look like unix time
    starts = [x if isinstance(x, (int, float)) and x > 1e9 else float("nan") for x in (d.get("start_times") or [None] * n)]
    rows = []
    for i in range(n):
        ok = not errs[i] and ttfts[i] not in (None, 0, 0.0)
        gaps = [g * 1e3 for g in (itls[i] or [])]
        ttft_ms = _num(ttfts[i]) * 1e3 if ttfts[i] is not None else float("nan")
        e2e_ms = _num(lat[i]) * 1e3 if lat[i] is not None else ttft_ms + sum(gaps)
        rows.append({"request_id": i, "phase": "measure", "point_index": 0, "point": point, "source": source,
                     "start_unix": starts[i], "ttft_ms": ttft_ms,
                     "e2e_ms": e2e_ms if ok else float("nan"), "itl_ms": gaps,
                     "input_tokens": ins[i], "output_tokens": outs[i], "status": "ok" if ok else "error",
                     "error": errs[i] or ""})
    return rows


def import_bench(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, requests) from a vLLM JSON or SGLang JSONL result file; the client is told from its fields."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"cannot read benchmark result {p}: {e}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p} is not a text file (not UTF-8): not a benchmark result") from None
    text = text.strip()
    if not text:
        raise SpecError(f"{p} is empty: not a benchmark result")
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise SpecError(f"{p} is neither a JSON object nor JSONL: {e}") from None
    summaries, requests = [], []
    if not docs:
        raise SpecError(f"{p} holds no benchmark result")
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or "request_throughput" not in d:
            raise SpecError(f"{p}: entry {i} is not a benchmark result (no request_throughput)")
        source = _which(d)
        row = _summary_row(d, source)
        row["point_index"] = i
        summaries.append(row)
        for r in _request_rows(d, source, row["point"]):
            r["point_index"] = i
            requests.append(r)
    summary = pd.DataFrame(summaries)
    req = pd.DataFrame(requests)
    if not req.empty:
        # what the peer wrote per request lets us recompute percentiles it did not report
        for i, g in req[req["status"] == "ok"].groupby("point_index"):
            for col in ("ttft_ms", "e2e_ms"):
                for pct in PCTS:
                    c = f"{col}_p{pct}"
                    if np.isnan(summary.loc[summary["point_index"] == i, c]).all():
                        summary.loc[summary["point_index"] == i, c] = float(np.percentile(g[col].dropna(), pct))
    return summary, req


def _which(d: dict[str, Any]) -> str:
    if any(k.endswith("_e2el_ms") for k in d) or "total_token_throughput" in d or "model_id" in d:
        return "vllm bench serve"
    if any(k.endswith("_e2e_latency_ms") for k in d) or "total_output_tokens_retokenized" in d:
        return "sglang bench_serving"
    return "unknown benchmark client"
