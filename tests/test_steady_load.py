"""A load that runs as production does: levels that fill, prompts that never repeat, mixed lengths, figures over the
steady window only (against the stub on loopback; the real engine in test_embedded_engine)."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import stub_command
from servescope.errors import SpecError
from servescope.load import random_prompts, run_sweep
from servescope.server import ManagedServer, ReadyCheck, free_port
from servescope.spec import LoadSpec, parse


def _stub(tmp_path, *args):
    port = free_port()
    return ManagedServer(command=stub_command(port, "--log-prompts", str(tmp_path / "asked.jsonl"), *args), port=port,
                         log_dir=tmp_path, model="stub", ready=ReadyCheck(poll_interval_s=0.1))


def _asked(tmp_path):
    return [json.loads(x) for x in (tmp_path / "asked.jsonl").read_text().splitlines()]


def test_a_load_that_cannot_fill_its_highest_level_is_refused():
    with pytest.raises(SpecError, match="cannot fill the level c=64.*requests_per_slot"):
        parse(LoadSpec, {"concurrency": [1, 64], "num_requests": 32}, "load")
    assert parse(LoadSpec, {"concurrency": [1, 64], "requests_per_slot": 4}, "load").level_requests(64) == 256
    assert parse(LoadSpec, {"concurrency": [1, 64], "requests_per_slot": 4}, "load").level_requests(1) == 32


def test_lognormal_lengths_mix_around_their_means_and_are_seeded():
    load = LoadSpec(lengths="lognormal", input_len=1024, output_len=256)
    a, b = load.lengths_for(4000, 7), load.lengths_for(4000, 7)
    assert a == b and len(set(a)) > 1000
    assert statistics.mean(i for i, _ in a) == pytest.approx(1024, rel=0.05)
    assert statistics.mean(o for _, o in a) == pytest.approx(256, rel=0.05)
    assert max(i for i, _ in a) <= 4 * 1024 and min(o for _, o in a) >= 1
    assert LoadSpec().lengths_for(3, 0) == [(64, 64)] * 3  # the default stays fixed (old points keep their meaning)


def test_steady_window_excludes_ramp_and_drain_and_the_level_fills(tmp_path):
    # 4 slots, 5 ms a token: in steady state the stub delivers 4 x 200 = 800 tokens/s; the ramp (a lockstep first
    # wave) and the drain (slots emptying after the last send) deliver less
    load = LoadSpec(concurrency=(4,), requests_per_slot=6, num_requests=1, output_len=30, lengths="lognormal",
                    steady_state=True, warmup_requests=0, input_len=8)
    with _stub(tmp_path, "--itl-ms", "5") as srv:
        res = run_sweep(srv.base_url, "stub", load, None, progress=False)
    row = res.summary().iloc[0]
    assert row["figures_over"] == "steady window" and row["completed"] > 0
    assert 0 < row["steady_from_s"] < row["steady_to_s"] < row["level_s"]
    assert row["filled"] and row["fill_pct"] >= 90
    whole = res.requests[res.requests["phase"] == "measure"]
    # what 4 always-busy slots deliver at the pace the requests themselves ran (800 on a quiet host; a CI run with
    # the end-to-end vLLM beside it slowed the stub's tokens to a third): the steady window holds no ramp or drain
    busy = 4 * whole["output_tokens"].sum() / (whole["e2e_ms"].sum() / 1e3)
    assert row["output_tok_s"] == pytest.approx(busy, rel=0.2) and row["output_tok_s"] < 800 * 1.2
    assert len(whole) == 24  # 6 per slot
    # the whole level, ramp and drain in, reads lower: what the figures would have been before
    span = (whole["start_unix"] + whole["e2e_ms"] / 1e3).max() - whole["start_unix"].min()
    assert whole["output_tokens"].sum() / span < row["output_tok_s"]


def test_a_level_that_did_not_fill_is_said():
    # a client that kept only 4 of its 8 slots busy (records as the runner writes them): the level measured c=4
    import pandas as pd

    from servescope.load.metrics import summarize

    rows = [{"phase": "measure", "point_index": 0, "point": "c=8", "mode": "closed", "concurrency": 8,
             "request_rate": float("nan"), "status": "ok", "start_unix": 100.0 + 0.1 * (i // 4) + 0.001 * (i % 4),
             "ttft_ms": 10.0, "e2e_ms": 100.0, "itl_ms": [10.0] * 9, "input_tokens": 8, "output_tokens": 10,
             "expected_output_tokens": 10} for i in range(40)]
    health = pd.DataFrame([{"point_index": 0, "steady_state": True, "asked_concurrency": 8}])
    row = summarize(pd.DataFrame(rows), health).iloc[0]
    assert row["asked_concurrency"] == 8 and not row["filled"]
    assert row["fill_pct"] == pytest.approx(50, abs=5)


def test_one_wave_has_no_steady_window(tmp_path):
    one_wave = LoadSpec(concurrency=(8,), num_requests=8, output_len=20, steady_state=True, warmup_requests=0)
    with _stub(tmp_path, "--itl-ms", "3") as srv:
        row = run_sweep(srv.base_url, "stub", one_wave, None, progress=False).summary().iloc[0]
    assert row["figures_over"].startswith("whole level: no steady window")


def test_prompts_never_repeat_in_a_timed_level_that_outruns_its_pool(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)} | {"[UNK]": 300}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    load = LoadSpec(concurrency=(4,), num_requests=8, duration_s=1.5, output_len=4, warmup_requests=0, input_len=6)
    with _stub(tmp_path, "--itl-ms", "2") as srv:
        res = run_sweep(srv.base_url, "stub", load, tok, progress=False)
    asked = [a["prompt"] for a in _asked(tmp_path)]
    assert len(asked) > 8 * 3  # far more than the first pool of 8
    assert len(set(asked)) == len(asked)  # none sent twice
    assert res.health.iloc[0]["prompts_grown_chunks"] >= 2


def test_warm_up_of_a_steady_load_is_short(tmp_path):
    load = LoadSpec(concurrency=(2,), num_requests=4, output_len=200, steady_state=True)
    with _stub(tmp_path) as srv:
        run_sweep(srv.base_url, "stub", load, None, progress=False)
    sizes = [a["max_tokens"] for a in _asked(tmp_path)]
    assert sizes[:2] == [16, 16] and sizes[2:] == [200] * 4


def test_random_prompts_take_per_prompt_lengths():
    ps = random_prompts(None, 3, 8, 8, 0, lengths=[(2, 5), (7, 1), (3, 3)])
    assert [(p.input_tokens, p.output_len) for p in ps] == [(2, 5), (7, 1), (3, 3)]


def test_a_level_that_did_not_fill_is_said_on_the_page():
    import pandas as pd

    from servescope.experiment import Results
    from servescope.nb import show_measured

    s = pd.DataFrame([{"config": "a", "rep": 0, "point": "c=8", "filled": False, "fill_pct": 51.0},
                      {"config": "a", "rep": 0, "point": "c=1", "filled": True, "fill_pct": 99.0}])
    res = Results(summary=s, requests=pd.DataFrame(), startup=pd.DataFrame(), points=pd.DataFrame({"config": ["a"]}),
                  errors=pd.DataFrame(columns=["config", "rep", "error_type"]), planned=1)
    words = show_measured(res).data
    assert "Levels that did not fill" in words and "a rep 1 c=8 (51%)" in words and "c=1" not in words


def test_notes_keyed_by_a_whole_load_keep_their_keys():
    """07's kept search is keyed by the load in full: the steady-load fields stay out of it at their defaults (the
    recorded sglang-h200 search was read as never tried before this)."""
    assert set(LoadSpec().full_dump()) & {"requests_per_slot", "lengths", "length_sigma", "steady_state"} == set()
    assert LoadSpec(steady_state=True).full_dump()["steady_state"] is True


def test_several_client_processes_share_a_level_and_send_each_prompt_once(tmp_path):
    """Two client processes, four slots each, at c=8: every request recorded once, no prompt sent twice, the level
    steady and filled, and the health names how many processes drove it."""
    load = LoadSpec(concurrency=(8,), requests_per_slot=4, num_requests=1, output_len=12, input_len=6,
                    steady_state=True, warmup_requests=0, client_processes=2)
    with _stub(tmp_path, "--itl-ms", "4") as srv:
        res = run_sweep(srv.base_url, "stub", load, None, progress=False)
    m = res.requests[res.requests["phase"] == "measure"]
    assert len(m) == 32 and m["request_id"].is_unique and (m["status"] == "ok").all()
    asked = [a["prompt"] for a in _asked(tmp_path)]
    assert len(asked) == 32 and len(set(asked)) == 32
    row = res.summary().iloc[0]
    assert row["filled"] and row["client_processes"] == 2


def test_telemetry_of_a_steady_level_covers_its_steady_window_only(tmp_path, stub_engine):
    """The readings of a level's ramp and drain are relabelled 'ramp:<level>' when read back, so the GPU, host and
    engine figures of a steady load cover what its throughput covers; a load without steady_state keeps them all."""
    from servescope.context import context
    from servescope.experiment import Config, run_configs, steady_windows
    from servescope.spec import Knobs
    from servescope.store import Store

    def run(steady, where):
        load = {"concurrency": [4], "requests_per_slot": 4, "num_requests": 4, "output_len": 24, "lengths": "lognormal",
                "steady_state": steady, "warmup_requests": 0}
        ctx = context(stub_engine, {"path": "stub"}, load, repetitions=1, store=Store(tmp_path / where),
                      progress=False, telemetry={"host_hz": 50}, deployment={"args": ["--ttft-ms", "100"]})
        res = run_configs(ctx, [Config("a", Knobs())], say=lambda m: None)
        assert res.errors.empty, res.errors[[c for c in res.errors if c in ("summary", "error", "traceback")]].to_dict("records")
        return res

    res = run(True, "steady")
    host = res.telemetry["host_cpu"]
    ((w0, w1),) = steady_windows(next(iter(res.stored.values()))).values()
    inside = host[host["phase"] == "c=4"]
    assert len(inside) and inside["time_unix"].between(w0, w1).all()
    assert (host["phase"] == "ramp:c=4").sum() > 0
    whole = run(False, "whole").telemetry["host_cpu"]
    assert not whole["phase"].str.startswith("ramp:").any()


def test_stored_requests_are_read_without_their_per_token_gaps():
    """The per-token gaps, the bulk of a real-size requests table, stay on disk: no thread reads them."""
    from pathlib import Path

    from servescope.experiment import read_store
    from servescope.store import Store

    store = Store(Path(__file__).resolve().parents[1] / "data" / "reference" / "vllm-qwen3-30b" / "store")
    pt = next(iter(store.points()))
    assert "itl_ms" in pt.table("requests")
    req = read_store(store).requests
    assert len(req) and "itl_ms" not in req and {"ttft_ms", "e2e_ms", "output_tokens"} <= set(req)
