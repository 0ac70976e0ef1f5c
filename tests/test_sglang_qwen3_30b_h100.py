"""SGLang 0.5.17 at real size on an H100 (data/reference/sglang-qwen3-30b-h100, recorded through
benchmarks/gpu/on_gpu.py with data/suites/sglang-qwen3-30b-h100.yaml): the deployment, model and load of the H200
recording, on the card vLLM 0.26's recording (data/reference/vllm-qwen3-30b) ran on, so the two engines meet on one
GPU model.

Known answers from real hardware: graphs on (decode full, prefill breakable) three times and graphs off three times
(the third off launch in a later session): 02 resolves the gain, 07 verifies it against the deployment from 02's
launches; its scheduler search at c=128 (a fourth session: the reference and five settings in one machine start; a
fifth: the reference and three of them again in another) finds no setting ahead of the combination, the three
launched in both starts behind it in both; 06 (the fifth session) finds SGLang's Triton fused MoE and its share from
an nsys window of its own; 04 finds that only one server fits the card; 03 finds the graphs-off deployment host-bound
at c=128; 99 sets SGLang beside vLLM on the H100 through the suite's compare_with. An eighth session recorded 02's
last two modes: full dies at prefill graph capture, compiled piecewise helps as piecewise does."""

from __future__ import annotations

import json
from pathlib import Path

from servescope.findings import read_findings, read_outcome
from servescope.store import Store

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "data" / "reference" / "sglang-qwen3-30b-h100"
CARD = "NVIDIA H100 80GB HBM3"


def _findings(thread: str) -> list:
    return read_findings(REF / "report" / f"{thread}.findings.json")


def test_every_point_ran_on_the_h100_and_the_graphed_ones_on_one_machine_start():
    pts = list(Store(REF / "store").points())
    full = [pt for pt in pts if len(pt.parts["load"]["concurrency"]) == 3]  # 02's launches; the search's hold c=128
    modes = sorted(pt.parts["knobs"]["cuda_graph"] for pt in full)
    assert modes == ["compiled_piecewise"] * 3 + ["decode_only"] * 3 + ["off"] * 3 + ["piecewise"] * 3
    assert {pt.card for pt in pts} == {CARD}
    # the first session's graphed launches and second off in one machine start, the third off in a later one, the
    # decode-only launches (05's eager arm, then 02's two more) in a seventh session's, the compiled piecewise ones
    # in an eighth's
    starts = {pt.machine_start for pt in full if pt.machine_start}
    assert len([pt for pt in full if pt.machine_start]) == 11 and len(starts) == 4
    by_mode = {m: {pt.machine_start for pt in full if pt.parts["knobs"]["cuda_graph"] == m}
               for m in ("piecewise", "decode_only", "compiled_piecewise")}
    assert all(len(s) == 1 for s in by_mode.values()) and len(set.union(*by_mode.values())) == 3
    # the search: its reference and five settings in one machine start of a later session (and one graphs-off launch
    # of `--only 07` before the fix that renders 07's inputs first: 07 had combined nothing), then its reference and
    # three settings again in the next session's start (06's profiled launch in that start too), then its reference,
    # the grid's last three settings and two of the first again in a sixth session's start
    profiled = [pt for pt in pts if "profile" in pt.parts]
    search = [pt for pt in pts if pt not in full and pt not in profiled]
    by_start: dict[str, int] = {}
    for pt in search:
        by_start[pt.machine_start] = by_start.get(pt.machine_start, 0) + 1
    assert sorted(by_start.values()) == [4, 6, 7] and set(by_start).isdisjoint(starts)
    assert len(profiled) == 1 and profiled[0].machine_start in by_start
    for pt in pts:
        s = pt.table("summary")
        assert set(s["figures_over"]) == {"steady window"} and s["filled"].all(), pt.key
        assert not pt.table("output_check").empty


def test_three_pairs_resolve_the_gain_at_every_level():
    head, *_ = _findings("02_piecewise_cuda_graphs")
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.effect.n == 3 and head.effect.ci_low_pct > 300  # +458%, 90% CI +397..+527%
    per = next(f for f in _findings("02_piecewise_cuda_graphs") if f.title == "CUDA graphs piecewise: piecewise vs off")
    levels = {k: v for k, v in per.evidence["effects"].items() if k.startswith("output_tok_s@")}
    assert levels["output_tok_s@c=1"]["ci_low_pct"] > 1000 and levels["output_tok_s@c=128"]["ci_low_pct"] > 50
    assert all(v["confidence"] == "high" for v in levels.values())
    o = read_outcome(REF / "report" / "02_piecewise_cuda_graphs.findings.json")
    # full died at its capture (recorded, not launched again) with the engine's own exception, which a finding
    # states: that is full's answer, so the thread reads ok with every other point measured
    assert (o.points_planned, o.points_measured, o.points_failed, o.points_unmeasured, o.points_died) == (13, 12, 1, 0, 1)
    assert o.status() == "ok" and o.first_error.startswith("full rep 1")
    assert o.summary() == "12 of 13 points measured, 1 died at launch (a finding)"


def test_02_decode_graphs_alone_help_and_are_not_told_apart_from_piecewise():
    """Decode graphs alone (prefill eager: 05's eager arm, then two more launches in the same machine start) against
    the deployment: +354%, high at every level; against piecewise (prefill graphs too) +23% in piecewise's favour,
    not resolved (the interval holds 0) and its sides never on one machine start, so the pick follows the fixed rule:
    the engine's default, piecewise."""
    fs = {f.title: f for f in _findings("02_piecewise_cuda_graphs")}
    dec = fs["CUDA graphs decode_only: decode_only vs off"]
    assert dec.confidence == "high" and dec.effect.n == 3 and dec.effect.ci_low_pct > 200
    levels = {k: v for k, v in dec.evidence["effects"].items() if k.startswith("output_tok_s@")}
    assert len(levels) == 3 and all(v["confidence"] == "high" and v["ci_low_pct"] > 50 for v in levels.values())
    assert "decode_only answers as off does" in dec.detail
    head = fs["Use CUDA graphs: piecewise"]
    assert head.evidence["tied"] == ["piecewise", "decode_only"] and head.evidence["chosen_by"]
    h2h = {h["effect"]["baseline"]: h for h in head.evidence["head_to_head"]}
    dec_h2h = h2h["decode_only"]
    assert dec_h2h["confidence"] == "low" and dec_h2h["effect"]["ci_low_pct"] < 0 < dec_h2h["effect"]["value_pct"]
    assert dec_h2h["words"].endswith("low, the sides never on one machine start")
    # only the unresolved head-to-head is said to leave the modes untold; the resolved one is said apart
    untold, told = head.detail.split(" Told apart head to head: ")
    assert "against decode_only" in untold and "compiled_piecewise" not in untold
    assert told.startswith("piecewise against compiled_piecewise: +1.7%")


def test_02_full_dies_at_prefill_capture_and_compiled_piecewise_helps_as_piecewise_does():
    """The two modes of 0.5.17 recorded in an eighth session: full (decode and prefill as whole graphs) dies 89 s after
    launch while SGLang captures prefill graphs, its Triton attention backend refusing an extend batch in graph
    replay; it is recorded once and not launched again. Compiled piecewise (prefill `tc_piecewise`, no
    `--enable-torch-compile`: 05's compile dies, this does not) serves, answers as graphs off does, and gains as much
    as piecewise; head to head piecewise leads by 1.7% at c=1 only, across machine starts, so it is said apart and not
    tied."""
    fs = {f.title: f for f in _findings("02_piecewise_cuda_graphs")}
    full = fs["CUDA graphs full: full dies before it is ready on sglang 0.5.17"]
    assert full.confidence == "high" and full.effect is None
    assert "(during the target prefill CUDA-graph capture): ValueError: Invalid forward mode" in full.claim
    assert "sglang/srt/layers/attention/triton_backend.py:1201 in _apply_cuda_graph_metadata" in full.claim
    head = fs["Use CUDA graphs: piecewise"]
    assert head.detail.endswith("in _apply_cuda_graph_metadata).") and "Dies at capture on this version: full" in \
        head.detail
    cp = fs["CUDA graphs compiled_piecewise: compiled_piecewise vs off"]
    assert cp.confidence == "high" and cp.effect.n == 3 and cp.effect.ci_low_pct > 300
    assert "compiled_piecewise answers as off does" in cp.detail
    assert "compile off, CUDA graphs compiled_piecewise (decode=full prefill=tc_piecewise)" in cp.detail
    h2h = next(h for h in head.evidence["head_to_head"] if h["effect"]["baseline"] == "compiled_piecewise")
    assert h2h["confidence"] == "medium" and h2h["effect"]["at"].startswith("at c=1")
    assert head.evidence["tied"] == ["piecewise", "decode_only"]
    (dead,) = [f for f in (REF / "store" / "_failed").iterdir()
               if json.loads((f / "manifest.json").read_text())["parts"]["knobs"].get("cuda_graph") == "full"]
    assert "Invalid forward mode" in (dead / "server.stderr.log").read_text()


def test_07_verifies_the_change_from_02s_launches_and_no_scheduler_setting_beats_it():
    """The search at c=128, where the KV cache is full: every setting of the grid tried, none ahead of the combination
    (the caps and small prefill chunks behind by 30-57%, the largest graph batch and a 2,048-token chunk within the
    combination's own 8% spread), so nothing is verified and nothing recommended; num_continuous_decode_steps is not
    launched (0.5.17 never reads it), nor an 8,192-token chunk (SGLang's own value here)."""
    head, tuning, *_ = _findings("07_verified_changes")
    assert head.title.startswith("Verified: the recommended changes together") and head.confidence == "high"
    assert head.effect.n == 3 and head.effect.ci_low_pct > 300
    assert tuning.title == "Scheduler tuning: no setting beat the recommended changes combined"
    assert tuning.confidence == "low" and tuning.change is None and "at c=128" in tuning.headline
    rows = {r["setting"]: r for r in tuning.evidence["search"]}
    measured = {k: r["vs_combined_pct"] for k, r in rows.items() if r["state"] == "measured" and not r["reference"]}
    assert set(measured) == {f"max_running_requests={n}" for n in (32, 64, 96)} | {
        f"chunked_prefill_size={n}" for n in (512, 2048)} | {f"cuda_graph_max_bs={n}" for n in (64, 256)}
    assert all(v <= 0 for v in measured.values()) and measured["max_running_requests=32"] < -50
    assert all(abs(measured[k]) < 8 for k in ("cuda_graph_max_bs=256", "chunked_prefill_size=2048"))
    # 8,192 tokens is what SGLang resolves the prefill chunk to on this card: the launch the sixth session made of it
    # read +0.0% against its start's reference, the same configuration; a render says so instead of a lead
    same = rows["chunked_prefill_size=8192"]
    assert same["state"] == "the default" and "already runs with chunked_prefill_size 8192" in same["status"]
    # launched in several machine starts, each against its own start's reference: behind in every one, by similar
    # amounts
    again = {k: r.get("launches") for k, r in rows.items() if (r.get("launches") or 0) > 1 and not r["reference"]}
    assert again == {"max_running_requests=32": 3, "chunked_prefill_size=512": 3, "cuda_graph_max_bs=64": 2}
    for r in (rows[k] for k in again):
        low, high = (float(x) for x in r["vs_combined_range_pct"].split(".."))
        assert low <= r["vs_combined_pct"] <= high < 0
    assert tuning.headline.startswith("One launch per setting and machine start at c=128")
    assert "in each of the 3 machine starts the settings ran in" in tuning.detail
    assert {r["state"] for r in rows.values()} == {"measured", "not read", "the default"}
    assert {k for k, r in rows.items() if r["state"] == "not read"} == {
        f"num_continuous_decode_steps={n}" for n in (2, 4, 8)}
    assert "spread of the combined configuration's own 3 launches" in tuning.detail
    page = (REF / "report" / "index.html").read_text()
    assert "Verified: +458.3% output_tok_s" in page and "none of the 7 tried at c=128" in page


def test_graphs_off_is_host_bound_at_the_top_level():
    fs = {f.title: f for f in _findings("03_clocks_power")}
    assert "the deployment at c=128: host-bound" in fs


def test_03s_timeline_is_one_panel_per_configuration_from_its_first_launch(tmp_path):
    """Issue 59: forty runs laid end to end with overlapping labels were not read at a glance. One panel per
    configuration, its first launch only, from the load's start: 27 points of 13 configurations (06's profiled launch
    of the deployment is one of its own) give the first 8 panels (the rest named as not drawn), each under a minute
    and a half of load except the deployment's three levels (its first launch: 02's sweep, not the search's one level
    under the same name), each level named once."""
    import shutil

    from servescope import nb
    from servescope.suite import load_suite
    from servescope.threads import clocks_power as t03

    shutil.copytree(REF / "store", tmp_path / "store")
    suite = load_suite(ROOT / "data" / "suites" / "sglang-qwen3-30b-h100.yaml")
    ctx = nb.context(suite.engine, suite.model, suite.load, store_dir=str(tmp_path / "store"), offline=True,
                     deployment=suite.deployment, telemetry=suite.telemetry)
    fig = t03.run(ctx).plot_timeline()
    axes = fig.axes
    assert [ax.get_title(loc="left") for ax in axes[:2]] == ["the deployment (the first of 4 launches)",
                                                            "cuda_graph=piecewise (the first of 6 launches)"]
    assert len(axes) == 8 and len({ax.get_title(loc="left") for ax in axes}) == 8
    assert axes[-1].get_xlabel().endswith("; 6 more configurations not drawn")
    labels = [[t.get_text() for t in ax.texts] for ax in axes]
    assert labels[0] == ["c=1", "c=16", "c=128"] and all(lab == ["c=128"] for lab in labels[2:])
    ends = [max(line.get_xdata().max() for line in ax.lines) for ax in axes]
    assert 200 < ends[0] < 300 and all(e < 100 for e in ends[1:-1])


def test_99_sets_sglang_beside_vllm_on_the_same_card():
    """compare_with names vLLM's H100 store: each engine's graphed configuration, three launches a side. SGLang ahead
    at c=1 (-3.6% for vLLM) and c=128 (-11.1%), no resolved difference at c=16; the page says the two engines'
    launches were not all on recorded machine starts (vLLM's points predate the record)."""
    import re

    page = re.sub(r"<[^>]+>", "", (REF / "report" / "99_summary.html").read_text())
    assert f"On {CARD}: sglang 0.5.17 serves it better at c=1, 128; no resolved difference at c=16." in page
    for figures in ("-3.6", "-5.2..-1.6", "-11.1", "-16.0..-2.7", "-2.8..+0.2"):
        assert figures in page, figures
    assert "machine starts not all recorded" in page


def test_06_names_the_triton_fused_moe_and_its_share_from_a_window_of_its_own():
    """The deployment (graphs off) under nsys at c=128, 128 prompts of its own with 32 tokens each, captured between
    the engine's /start_profile and /stop_profile: SGLang's Triton fused MoE (fused_moe_kernel twice per layer and
    step, with sgl-kernel's align, sort and sum-reduce around it) is 61% of GPU kernel time; no other MoE path ran
    (sgl-kernel's sort and sum-reduce kernels read 'unknown' before the pattern table named them). The ceiling probe
    on the model's expert shapes (128 experts, top 8, 2048 x 768) bounds what grouping would give, and grouping is
    already what runs."""
    f, = _findings("06_grouped_gemm")
    assert f.title == "MoE already grouped: triton_fused_moe" and f.optimal and f.confidence == "high"
    ev = f.evidence
    assert [p["moe_path"] for p in ev["paths"]] == ["triton_fused_moe"]
    assert 0.55 < ev["paths"][0]["share"] < 0.65
    step = ev["launches"][0]
    assert step["steps_from"].startswith("launches of 'fused_rope_store_kernel'") and 100 < step["steps"] < 150
    assert "fused_moe_kernel 2.0" in f.headline
    assert ev["shape"] == {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 768, "layers": 48, "moe_layers": 48,
                           "dtype": "bfloat16"}
    assert [r["tokens"] for r in ev["probe"]] == [1, 16, 128] and all(r["speedup"] > 1 for r in ev["probe"])
    pt, = [pt for pt in Store(REF / "store").points() if "profile" in pt.parts]
    prof = pt.manifest["profile"]
    assert prof["kind"] == "nsys" and prof["requests"] == prof["completed"] == 128 and prof["window_s"] < 30
    assert pt.parts["knobs"]["cuda_graph"] == "off"  # the deployment as it runs


def test_04_says_only_one_server_fits_the_card_and_why():
    """One H100 and a 57 GiB model: two replicas on the card do not fit (the arithmetic, from the card's free memory
    and the engine's memory share), replicas over GPUs and TP/DP need GPUs this machine lacks; nothing launched."""
    head, *rest = _findings("04_data_parallelism")
    assert head.title == "Layouts: not compared" and head.headline.startswith(
        "Only one server fits on this one GPU: no other layout could run here, so nothing was launched")
    why = {f.title: f.headline for f in rest}
    shared = why["2 replicas on 1 GPU, round-robin: not available here"]
    assert "2 replicas of a 56.9 GiB model do not fit on GPU 0" in shared and "below its weights and context" in shared
    assert "needs 2 GPUs; 1 visible here" in why["2 replicas, round-robin: not available here"]
    assert "tp=2: not available here" in why
    o = read_outcome(REF / "report" / "04_data_parallelism.findings.json")
    assert o.points_planned == 0 and o.status() == "ok"


def test_offline_a_stored_setting_is_spelled_by_the_release_that_ran_it(tmp_path):
    """Rendered here, where SGLang 0.5.17's interpreter (the GPU machine's) is absent, the search's settings showed
    '(read from the store)' for their flags: they are spelled from that release's published flags (its wheel, cached
    per user) as the run that launched them spelled them; a setting the store lacks stays unspelled and unasked."""
    import shutil

    from servescope import nb
    from servescope.queries import expressible
    from servescope.spec import Knobs
    from servescope.study import Arm
    from servescope.suite import load_suite

    shutil.copytree(REF / "store", tmp_path / "store")
    suite = load_suite(ROOT / "data" / "suites" / "sglang-qwen3-30b-h100.yaml")
    (pt,) = [p for p in Store(REF / "store").points() if p.parts["knobs"].get("max_running_requests") == 32][:1]
    ctx = nb.context(suite.engine, suite.model, pt.parts["load"], store_dir=str(tmp_path / "store"), offline=True,
                     deployment=suite.deployment, telemetry=suite.telemetry)  # the search's load: its level
    ctx = ctx.with_(pinned_start=pt.parts["machine_start"])  # a search point is its machine start's
    stored = Knobs(**{k: v for k, v in pt.parts["knobs"].items() if k != "extra_args"})
    ex = expressible(ctx, [Arm("mrr32", stored), Arm("mrr48", stored.model_copy(update={"max_running_requests": 48}))])
    got = dict(zip(ex["arm"], ex["flags"], strict=True))
    assert "--max-running-requests 32" in got["mrr32"] and got["mrr32"] in " ".join(pt.target["flags"])
    assert got["mrr48"] == "" and not ex["asked"].any()


def test_05_names_compiles_crash_inside_torch_compile_at_real_size():
    """torch.compile with decode graphs (the compiled arm) dies while SGLang captures decode graphs at real size as on
    the toy: an assert inside Dynamo's tracer on the call at SGLang's multi-platform op dispatch (the rotary
    embedding), then SGLang's own teardown. The page names both frames, the compiler's first. The eager arm (decode
    graphs alone) was launched once in a later session (what it is compared with is dead), and both probes (compile
    with each piecewise form) died the same way: whether compile excludes piecewise graphs is not told, instead of
    reading the probes' deaths as an exclusion."""
    head, excl = _findings("05_torch_compile")
    assert head.title == "torch.compile: compiled dies before it is ready on sglang 0.5.17"
    assert head.confidence == "high" and head.effect is None
    assert "(during the target decode CUDA-graph capture): AssertionError (no message) (at " \
        "torch/_dynamo/symbolic_convert.py:2177 in jump, inside torch.compile compiling the call at " \
        "sglang/srt/layers/utils/multi_platform.py:83 in forward)" in head.claim
    # what the side that lives served, beside the death: the engineer's fallback in figures
    assert head.detail.endswith("Eager served: c=1 111, c=16 591, c=128 2,650 output tok/s (one launch).")
    assert excl.title == "torch.compile with piecewise CUDA graphs: not verified (compile dies without them too)"
    assert excl.confidence == "none" and not excl.applies
    assert "the compiled arm (decode_only graphs) and the probes (piecewise, compiled_piecewise) each dies" in excl.claim
    o = read_outcome(REF / "report" / "05_torch_compile.findings.json")
    assert (o.points_planned, o.points_measured, o.points_failed, o.points_died) == (2, 1, 1, 1) and o.status() == "ok"
    eager = [pt for pt in Store(REF / "store").points() if pt.parts["knobs"].get("torch_compile") is False]
    assert len(eager) == 1 and eager[0].parts["knobs"]["cuda_graph"] == "decode_only"
    failed = [f for f in sorted((REF / "store" / "_failed").iterdir())
              if json.loads((f / "manifest.json").read_text())["parts"]["knobs"].get("torch_compile")]
    assert len(failed) == 3  # the compiled arm and the two probes (02's full mode died of its own cause)
    for f in failed:
        assert "torch/_dynamo/symbolic_convert.py\", line 2177, in jump" in (f / "server.stderr.log").read_text()
