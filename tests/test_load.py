"""Load generator against the stub: records, timings, modes, datasets, failures recorded not raised, summaries."""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from conftest import stub_command
from servescope.errors import SpecError
from servescope.load import jsonl_prompts, random_prompts, run_level, run_sweep, sharegpt_prompts, summarize
from servescope.load.client import build_body
from servescope.load.health import judge_health
from servescope.load.runner import _health
from servescope.server import ManagedServer, ReadyCheck, free_port
from servescope.spec import LoadPoint, LoadSpec, parse


@pytest.fixture
def stub(tmp_path, request):
    args = getattr(request, "param", ())
    port = free_port()
    with ManagedServer(command=stub_command(port, *args), port=port, log_dir=tmp_path, model="stub",
                       ready=ReadyCheck(poll_interval_s=0.1)) as srv:
        yield srv


@pytest.mark.parametrize("stub", [("--ttft-ms", "60", "--itl-ms", "5")], indirect=True)
@pytest.mark.parametrize("endpoint", ["completions", "chat", "generate"])
def test_records_timings_from_stream(stub, endpoint):
    load = LoadSpec(concurrency=(2,), num_requests=4, output_len=10, endpoint=endpoint, warmup_requests=1)
    prompts = random_prompts(None, 4, 8, 10, seed=0)
    recs = run_level(stub.base_url, "stub", load, 2, prompts, prompts[:1], progress=False)
    measured = [r for r in recs if r.phase == "measure"]
    assert len(measured) == 4 and sum(r.phase == "warmup" for r in recs) == 1
    for r in measured:
        assert r.status == "ok", r.error
        assert r.ttft_ms >= 55  # chat's role-only opening delta, sent at once, is not the first token
        assert len(r.itl_ms) == 9  # the empty-text token still counts
        # the stub keeps a 5 ms schedule from its first token, so a late token is followed by a short gap: the mean
        # holds on a loaded host where a median once read 3.98
        assert np.mean(r.itl_ms) >= 3.5 and sum(r.itl_ms) <= r.e2e_ms - r.ttft_ms + 0.01  # e2e ends at [DONE]
        assert r.output_tokens == 10 and r.input_tokens == 8
        assert all(x == round(x, 4) for x in r.itl_ms)  # 0.1 us: finer digits are jitter that tripled the store


@pytest.mark.parametrize("stub", [("--itl-ms", "4", "--chunk-tokens", "3")], indirect=True)
def test_generate_spreads_multi_token_chunks(stub):
    load = LoadSpec(concurrency=(1,), num_requests=1, output_len=10, endpoint="generate", warmup_requests=0)
    (r,) = run_level(stub.base_url, "stub", load, 1, random_prompts(None, 1, 5, 10, 0), progress=False)
    assert r.status == "ok" and r.output_tokens == 10 and r.chunks == 4  # 1 + 3 + 3 + 3 tokens
    assert len(r.itl_ms) == 9  # one gap per token after the first, each chunk's gap split evenly
    assert r.itl_ms[0] == pytest.approx(r.itl_ms[1]) == pytest.approx(r.itl_ms[2])
    assert all(x == round(x, 4) for x in r.itl_ms)


@pytest.mark.parametrize("stub", [("--fail-every", "3",)], indirect=True)
def test_failures_are_recorded_not_raised(stub):
    load = LoadSpec(concurrency=(1, 3), num_requests=6, output_len=4, warmup_requests=0)
    res = run_sweep(stub.base_url, "stub", load, None, progress=False)
    df = res.requests
    assert len(df) == 12
    bad = df[df["status"] == "error"]
    assert len(bad) == 4 and bad["error"].str.contains("HTTP 500").all()
    s = res.summary()
    assert list(s["point"]) == ["c=1", "c=3"]
    assert s["completed"].sum() == 8 and s["failed"].sum() == 4


def test_unreachable_server_is_an_error_record():
    load = LoadSpec(concurrency=(1,), num_requests=2, warmup_requests=0, request_timeout_s=2)
    recs = run_level(f"http://127.0.0.1:{free_port()}", "m", load, 1, random_prompts(None, 2, 4, 4, 0), progress=False)
    assert [r.status for r in recs] == ["error", "error"]
    assert all("onnect" in r.error for r in recs)


@pytest.mark.parametrize("stub", [("--itl-ms", "1",)], indirect=True)
def test_client_cpu_is_the_event_loops_own(stub):
    """A level of a few tenths of a second read 103.6% from the process's tick-counted times (make test-fast,
    2026-12-03), and any other busy thread of the host process (a notebook's, hashing here without the GIL) was
    counted as the client's: client_cpu_pct is the loop thread's alone."""
    import hashlib
    import threading

    stop = threading.Event()
    block = b"x" * (1 << 20)

    def burn() -> None:
        while not stop.is_set():
            hashlib.sha256(block).digest()

    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        load = LoadSpec(concurrency=(2,), num_requests=20, output_len=8, warmup_requests=0)
        (row,) = run_sweep(stub.base_url, "stub", load, None, progress=False).summary().to_dict("records")
    finally:
        stop.set()
        t.join()
    assert 0 <= row["client_cpu_pct"] <= 100, row["client_cpu_pct"]


@pytest.mark.parametrize("stub", [("--itl-ms", "1",)], indirect=True)
def test_warmup_is_excluded_and_health_reported(stub):
    load = LoadSpec(concurrency=(2,), num_requests=6, output_len=4, warmup_requests=3)
    res = run_sweep(stub.base_url, "stub", load, None, progress=False)
    assert (res.requests["phase"] == "warmup").sum() == 3
    (row,) = res.summary().to_dict("records")
    assert row["completed"] == 6  # warmup requests are not counted
    assert 0 <= row["client_cpu_pct"] < 100 and row["loop_lag_ms_p99"] >= 0
    assert not row["client_limited"] and not row["client_starved"]


@pytest.mark.parametrize("stub", [()], indirect=True)
def test_closed_loop_by_duration(stub):
    load = LoadSpec(concurrency=(3,), num_requests=4, output_len=4, duration_s=1.0, warmup_requests=0)
    df = run_sweep(stub.base_url, "stub", load, None, progress=False).requests
    assert len(df) > 12  # the 4-prompt pool is cycled for a whole second
    assert (df["start_unix"] - df["start_unix"].min()).max() < 1.1


@pytest.mark.parametrize("stub", [()], indirect=True)
def test_open_loop_poisson_rate_and_cap(stub):
    load = LoadSpec(mode="open", request_rate=(40.0,), num_requests=60, output_len=2, warmup_requests=0, seed=3)
    res = run_sweep(stub.base_url, "stub", load, None, progress=False)
    (h,) = res.health.to_dict("records")
    assert 40 * 0.7 < h["achieved_rate"] < 40 * 1.3
    gaps = np.diff(np.sort(res.requests["scheduled_unix"].to_numpy()))
    assert 0.7 < gaps.std() / gaps.mean() < 1.3  # exponential gaps: coefficient of variation 1

    capped = LoadSpec(mode="open", request_rate=(math.inf,), max_concurrency=3, num_requests=12, output_len=20,
                      warmup_requests=0)
    df = run_sweep(stub.base_url, "stub", capped, None, progress=False).requests
    start, end = df["start_unix"].to_numpy(), (df["start_unix"] + df["e2e_ms"] / 1e3).to_numpy()
    in_flight = max(((start <= t) & (end > t)).sum() for t in start)
    assert in_flight <= 3


def test_gamma_burstiness_spreads_arrivals(tmp_path):
    """Shape 0.25 gives inter-arrival CV of 2; checked on the arrival process alone, at a rate nothing limits."""
    port = free_port()
    with ManagedServer(command=stub_command(port), port=port, log_dir=tmp_path, model="stub",
                       ready=ReadyCheck(poll_interval_s=0.1)) as srv:
        load = LoadSpec(mode="open", request_rate=(100.0,), burstiness=0.25, num_requests=200, output_len=1,
                        warmup_requests=0, seed=11)
        df = run_sweep(srv.base_url, "stub", load, None, progress=False).requests
    gaps = np.diff(np.sort(df["scheduled_unix"].to_numpy()))
    assert 1.5 < gaps.std() / gaps.mean() < 2.6


def test_summary_arithmetic_and_goodput():
    rows = [dict(phase="measure", point_index=0, point="c=1", mode="closed", concurrency=1, request_rate=None,
                 status="ok", start_unix=100.0 + i, e2e_ms=1000.0, ttft_ms=100.0 * (i + 1), itl_ms=[10.0, 20.0],
                 input_tokens=5, output_tokens=3, expected_output_tokens=3) for i in range(3)]
    rows.append(dict(rows[0], phase="warmup", start_unix=90.0))
    rows.append(dict(rows[0], status="error", ttft_ms=None, e2e_ms=5.0, output_tokens=None))
    s = summarize(pd.DataFrame(rows), slo_ms={"ttft_ms": 250}).iloc[0]
    assert s["completed"] == 3 and s["failed"] == 1 and s["duration_s"] == pytest.approx(3.0)
    assert s["output_tok_s"] == pytest.approx(9 / 3.0) and s["total_tok_s"] == pytest.approx(24 / 3.0)
    assert s["request_s"] == pytest.approx(1.0)
    assert s["ttft_ms_p50"] == pytest.approx(200.0) and s["ttft_ms_p95"] == pytest.approx(290.0)
    assert s["tpot_ms_mean"] == pytest.approx(np.mean([(1000 - 100 * (i + 1)) / 2 for i in range(3)]))
    assert s["itl_ms_p50"] == pytest.approx(15.0)
    assert s["good_requests"] == 2 and s["goodput_req_s"] == pytest.approx(2 / 3.0)
    assert s["short_outputs"] == 0


def test_health_tells_a_limited_client_from_a_starved_one():
    pt = LoadPoint(0, "rate=100", "open", None, 100.0)
    load = LoadSpec(mode="open", request_rate=(100.0,))
    busy = _health(pt, load, wall_s=10.0, cpu_s=9.7, lags_ms=[1.0] * 98 + [40.0, 50.0],
                   send_lags_ms=[0.0] * 400 + [200.0] * 100, sent_times=list(np.linspace(0, 10, 500)))
    assert busy["client_limited"] and not busy["client_starved"]
    w = busy["client_warning"]
    assert "97% of a core" in w and "woke" in w and "200 ms behind their schedule" in w and "req/s of the 100" in w
    # a short Poisson point strays from the mean rate with the client on time: not the client's doing (seen on the
    # H200: 8 arrivals at 2 req/s came out at 1.63 req/s)
    short = _health(LoadPoint(0, "rate=2", "open", None, 2.0), load, wall_s=5.0, cpu_s=0.1, lags_ms=[0.5] * 10,
                    send_lags_ms=[0.2] * 8, sent_times=list(np.linspace(0, 7 / 1.63, 8)))
    assert short["achieved_rate"] == pytest.approx(1.63) and not short["client_limited"]
    # a stored point without send lags is judged by its achieved rate
    assert "req/s of the 2 asked for" in judge_health({"capped": False, "requested_rate": 2.0, "achieved_rate": 1.5,
                                                       "client_cpu_pct": 1.0, "loop_lag_ms_p99": 0.5})["client_warning"]
    starved = _health(pt, load, wall_s=10.0, cpu_s=0.3, lags_ms=[0.5] * 98 + [300.0, 400.0], send_lags_ms=[0.0],
                      sent_times=list(np.linspace(0, 10, 1001)))
    assert starved["client_starved"] and not starved["client_limited"]
    assert "oversubscribed" in starved["client_warning"]
    ok = _health(pt, load, wall_s=10.0, cpu_s=1.0, lags_ms=[0.5] * 100, send_lags_ms=[0.0],
                 sent_times=list(np.linspace(0, 10, 1001)))
    assert not ok["client_limited"] and not ok["client_starved"] and ok["client_warning"] == ""
    capped = _health(LoadPoint(0, "rate=100, cap=2", "open", 2, 100.0), load, wall_s=10.0, cpu_s=1.0,
                     lags_ms=[0.5] * 100, send_lags_ms=[0.0], sent_times=list(np.linspace(0, 10, 100)))
    assert not capped["client_limited"]  # a cap holds arrivals back on purpose


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20 + ["kernels launch on the GPU"] * 20,
                            trainer=trainer)
    return tok


@pytest.mark.parametrize("n_tokens", [1, 7, 64, 300])
def test_random_prompts_have_exact_token_length(n_tokens):
    tok = _tokenizer()
    prompts = random_prompts(tok, 5, n_tokens, 16, seed=1)
    assert all(p.exact for p in prompts)
    for p in prompts:
        assert len(tok.encode(p.text, add_special_tokens=False).ids) == n_tokens
        assert "<|endoftext|>" not in p.text
    assert prompts == random_prompts(tok, 5, n_tokens, 16, seed=1)  # seeded
    assert prompts != random_prompts(tok, 5, n_tokens, 16, seed=2)


def test_sharegpt_file(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": f"question number {i} about kernels and graphs"},
                                {"from": "gpt", "value": " ".join(["word"] * (5 + i))}]} for i in range(10)]
    convs.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a b c d e"}]})
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    tok = _tokenizer()
    ps = sharegpt_prompts(path, tok, 10, None, seed=0)
    assert len(ps) == 10 and all(p.exact for p in ps)
    assert "hi" not in [p.text for p in ps]  # too short, skipped
    assert sorted(p.output_len for p in ps) == sorted(len(tok.encode(" ".join(["word"] * (5 + i))).ids) for i in range(10))
    assert {p.output_len for p in sharegpt_prompts(path, tok, 3, 32, seed=0)} == {32}
    with pytest.raises(SpecError, match="only 10 usable"):
        sharegpt_prompts(path, tok, 11, None, seed=0)


def test_jsonl_file_and_spec_validation(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one two three", "output_len": 5}\n\n'
                    '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]}\n')
    ps = jsonl_prompts(path, None, 4, output_len=9, seed=0)
    assert len(ps) == 4 and {p.output_len for p in ps} == {5, 9}
    assert any(p.messages == (("system", "be brief"), ("user", "hello")) for p in ps)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(SpecError, match="needs a 'prompt' or 'messages'"):
        jsonl_prompts(bad, None, 1, 4, 0)
    with pytest.raises(SpecError, match="does not exist"):
        parse(LoadSpec, {"dataset": "jsonl", "dataset_path": str(tmp_path / "nope.jsonl")}, "load")
    with pytest.raises(SpecError, match="needs dataset_path"):
        parse(LoadSpec, {"dataset": "sharegpt"}, "load")
    with pytest.raises(SpecError, match="request_rate"):
        parse(LoadSpec, {"mode": "open"}, "load")
    with pytest.raises(SpecError, match="unknown SLO"):
        parse(LoadSpec, {"slo_ms": {"ttft": 100}}, "load")


@pytest.mark.parametrize("stub", [()], indirect=True)
def test_chat_from_jsonl_messages(stub, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hello there friend"}]}\n')
    load = LoadSpec(concurrency=(1,), num_requests=2, endpoint="chat", dataset="jsonl", dataset_path=str(path),
                    output_len=3, warmup_requests=0)
    df = run_sweep(stub.base_url, "stub", load, None, progress=False).requests
    assert (df["status"] == "ok").all() and (df["input_tokens"] == 3).all() and (df["output_tokens"] == 3).all()


@pytest.mark.parametrize("stub", [()], indirect=True)
def test_runs_inside_a_running_event_loop(stub):
    """Jupyter runs cells inside an event loop; the load must still run there."""
    load = LoadSpec(concurrency=(2,), num_requests=3, output_len=4, warmup_requests=0)

    async def cell():
        return run_sweep(stub.base_url, "stub", load, None, progress=False)

    df = asyncio.run(cell()).requests
    assert (df["status"] == "ok").all() and len(df) == 3


@pytest.mark.parametrize("stub", [("--itl-ms", "20",)], indirect=True)
def test_two_thousand_concurrent_streams(stub):
    """2,000 streams open at once against the stub complete with zero client errors."""
    load = LoadSpec(concurrency=(2000,), num_requests=2000, output_len=4, warmup_requests=0, request_timeout_s=120)
    res = run_sweep(stub.base_url, "stub", load, None, progress=False)
    df = res.requests
    assert len(df) == 2000 and (df["status"] == "ok").all(), df["error"].value_counts().head()
    start, end = df["start_unix"].to_numpy(), (df["start_unix"] + df["e2e_ms"] / 1e3).to_numpy()
    assert ((start <= np.median(end)) & (end > np.median(start))).sum() > 1000  # really concurrent


def test_a_thousand_requests_per_second_open_loop_without_client_errors(tmp_path):
    """Open loop at 1,000 requests/s (Poisson) for 3 s against the zero-work stub: every request is answered, none is
    lost or counted twice, and the health row reports the rate it achieved. The rate itself is a timing, measured by
    `make bench-openloop` (a loaded 2-core machine achieved 937-947 req/s where this test once asserted 950)."""
    import sys
    from pathlib import Path

    from servescope.server import ManagedServer, ReadyCheck, free_port

    port = free_port()
    zero = Path(__file__).resolve().parents[1] / "benchmarks" / "zero_stub.py"
    stub = ManagedServer(command=[sys.executable, str(zero), "--port", str(port), "--tokens", "8"], port=port,
                         log_dir=tmp_path, model="stub", ready=ReadyCheck(generate_path=None, poll_interval_s=0.1))
    load = LoadSpec(mode="open", request_rate=(1000.0,), num_requests=3000, output_len=8, warmup_requests=0)
    with stub:
        res = run_sweep(stub.base_url, "stub", load, None, progress=False)
    df, h = res.requests, res.health.iloc[0]
    assert len(df) == 3000 and (df["status"] == "ok").all(), df["error"].value_counts().head()
    assert sorted(df["request_id"]) == list(range(3000))  # none lost, none counted twice
    assert h["requested_rate"] == 1000.0 and h["achieved_rate"] > 0


@pytest.mark.parametrize("stub", [("--keepalive-s", "0.3")], indirect=True)
def test_a_keepalive_connection_the_server_closed_while_the_client_stalled_is_sent_again(stub):
    """Seen in a cold run here: the client's loop starved for 5.4 s at c=16, vLLM's server (uvicorn, 5 s keep-alive)
    closed the idle pooled connections, and the requests then written on them failed with "Server disconnected"
    (4 of 32: the level failed). Nothing of them was served, so each is sent once more and says so."""
    import aiohttp

    from servescope.load.client import RequestRecord, send_request

    body = build_body("completions", "stub", random_prompts(None, 1, 8, 8, seed=0)[0], True)

    async def go() -> list[RequestRecord]:
        async with aiohttp.ClientSession() as session:
            first = await send_request(session, stub.base_url + "/v1/completions", "completions", body,
                                       RequestRecord(0, "measure"), {})
            time.sleep(0.8)  # the loop starved: the server's close of the pooled connection is not seen yet
            second = await send_request(session, stub.base_url + "/v1/completions", "completions", body,
                                        RequestRecord(1, "measure"), {})
            return [first, second]

    first, second = asyncio.run(go())
    assert first.status == "ok" and first.retried == 0
    assert second.status == "ok", second.error
    assert second.retried == 1 and second.output_tokens == 8


def test_a_request_sent_again_marks_the_point_starved():
    h = judge_health({"client_cpu_pct": 3.0, "loop_lag_ms_p99": 1.0, "requests_retried": 4})
    assert h["client_starved"] and "4 request(s) sent again" in h["client_warning"]
    assert not judge_health({"client_cpu_pct": 3.0, "loop_lag_ms_p99": 1.0, "requests_retried": 0})["client_starved"]


@pytest.mark.parametrize("stub", [("--ttft-ms", "1500", "--itl-ms", "150")], indirect=True)
def test_a_request_timeout_runs_from_the_first_token_not_through_queueing(stub):
    """A full server holds a request 1.5 s before its first token: a 1 s request timeout does not cut that wait (the
    hang watchdog bounds a server that sends nothing); a stream still going 1 s after its first token fails."""
    prompts = random_prompts(None, 2, 4, 4, seed=0)
    short = LoadSpec(concurrency=(1,), num_requests=1, output_len=4, warmup_requests=0, request_timeout_s=1)
    (r,) = run_level(stub.base_url, "stub", short, 1, prompts[:1], progress=False)
    assert r.status == "ok", r.error
    assert r.ttft_ms > 1400 and r.output_tokens == 4
    long = short.model_copy(update={"output_len": 12})
    (r,) = run_level(stub.base_url, "stub", long, 1, random_prompts(None, 1, 4, 12, seed=1), progress=False)
    assert r.status == "error" and "after its first token (load.request_timeout_s)" in r.error
