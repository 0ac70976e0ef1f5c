"""measure() and thread 5 end to end on the stub engine: alternation, the store, failures kept apart, offline."""

from __future__ import annotations

import pytest

from servescope.context import context
from servescope.experiment import Config, measure
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
from servescope.store import Store
from servescope.threads import torch_compile as t05

LOAD = LoadSpec(concurrency=(1, 4), num_requests=8, output_len=8, warmup_requests=0)
MODEL = ModelSpec(path="stub")


def test_alternating_repetitions_and_store_reuse(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfgs = [Config("a", Knobs()), Config("b", Knobs(torch_compile=False))]
    res = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=3, store=store, say=lambda m: None)
    assert res.errors.empty
    order = res.points.sort_values("started_unix")[["config", "rep"]].values.tolist()
    assert order == [["a", 0], ["b", 0], ["b", 1], ["a", 1], ["a", 2], ["b", 2]]
    assert set(res.summary["concurrency"]) == {1, 4} and len(res.summary) == 12
    assert (res.summary["completed"] == 8).all()
    said: list[str] = []
    again = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=3, store=store, say=said.append)
    assert all("from store" in m for m in said) and len(said) == 6
    assert again.summary["output_tok_s"].tolist() == res.summary["output_tok_s"].tolist()


def test_failing_config_is_recorded_and_others_complete(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfgs = [Config("good", Knobs()), Config("bad", Knobs(extra_args=("--mode", "exit")))]
    res = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=1, store=store, say=lambda m: None)
    assert set(res.summary["config"]) == {"good"}
    assert res.errors["config"].tolist() == ["bad"]
    assert res.errors["error_type"].iloc[0] == "ServerExitedError"
    key = res.errors["key"].iloc[0]
    failed = store.failed_attempts(key)
    assert len(failed) == 1 and (failed[0] / "server.stderr.log").read_text().count("fatal") == 1
    assert not store.has(key)


def test_offline_reads_store_and_reports_missing(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfg = [Config("a", Knobs())]
    measure(EngineSpec(**stub_engine), MODEL, cfg, LOAD, repetitions=1, store=store, say=lambda m: None)
    res = measure(EngineSpec(**stub_engine), MODEL, cfg, LOAD, repetitions=2, store=store, offline=True,
                  say=lambda m: None)
    assert res.summary["rep"].unique().tolist() == [0]
    # a shorter recording renders as what it holds (n=1, said), not as a failed point
    assert res.errors.empty and res.stopped.startswith("the store holds 1 repetition")
    other = measure(EngineSpec(**stub_engine), MODEL, [Config("b", Knobs(torch_compile=False))], LOAD, repetitions=2,
                    store=store, offline=True, say=lambda m: None)
    assert other.errors["error_type"].tolist() == ["NotMeasuredError"]  # nothing of it at all: missing, said so


def test_offline_keeps_every_repetition_of_the_configurations_the_store_holds_longer(tmp_path, stub_engine):
    """A store with three repetitions of a and b but one of c (a recording cut short): offline, a and b render with
    all three, c with its one, and the reason says how many of each the store holds."""
    store = Store(tmp_path)
    a, b, c = Config("a", Knobs()), Config("b", Knobs(torch_compile=False)), Config("c", Knobs(torch_compile=True))
    measure(EngineSpec(**stub_engine), MODEL, [a, b], LOAD, repetitions=3, store=store, say=lambda m: None)
    measure(EngineSpec(**stub_engine), MODEL, [c], LOAD, repetitions=1, store=store, say=lambda m: None)
    res = measure(EngineSpec(**stub_engine), MODEL, [a, c, b], LOAD, repetitions=3, store=store, offline=True,
                  say=lambda m: None)
    reps = res.summary.groupby("config")["rep"].nunique().to_dict()
    assert reps == {"a": 3, "b": 3, "c": 1} and res.errors.empty
    assert res.stopped == ("the store holds 3 repetitions of a and b; 1 repetition of c "
                           "(offline: nothing more is measured)")


def test_thread05_finds_known_effect(tmp_path, stub_engine):
    """The stub streams 4x slower per token when torch_compile=False and reports what it ran as: the thread must
    say compile helps, with both sides verified, and recommend compile in the engine's spelling; so large an effect
    resolves in the plan's three repetitions, though six are allowed."""
    load = {"concurrency": [1, 4], "num_requests": 8, "output_len": 16, "warmup_requests": 0}
    cs = t05.run(context(stub_engine, {"path": "stub"}, load, repetitions=3, max_repetitions=6,
                         store_dir=str(tmp_path)), exclusion=False)
    study = cs.study
    assert study.results.stopped == "resolved after 3 repetitions"
    eff = cs.comparison.effects()
    tok = eff[eff["metric"] == "output_tok_s"]
    assert (tok["effect_pct"] > 50).all() and (tok["n_pairs"] == 3).all()
    (f,) = t05.findings(cs)
    assert f.confidence == "high" and f.effect.value_pct > 50 and f.effect.n == 3
    assert f.effect.status == "better" and len(f.effect.per_rep_pct) == 3 and f.effect.stopped == study.results.stopped
    assert "Per repetition (mean over c=1, 4)" in f.claim
    assert f.claim.startswith("torch.compile helps") and "so the effect is torch.compile's" in f.claim
    assert "compiled ran as compile on, CUDA graphs off" in f.claim
    assert f.recommended_flags == ["--itl-ms", "1"]  # the stub's spelling of torch_compile=True
    v = study.verification()
    assert set(v[v["field"] == "compile"]["status"]) == {"as requested"}
    assert study.plot() is not None and t05.comparison(study).plot_effects() is not None


@pytest.mark.parametrize("mode,title,conf,says", [
    ("silent", "torch.compile: compiled vs eager", "low", "compile on compiled not verified"),
    ("graphs_full_when_compiled", "torch.compile: compiled vs eager", "low", "graph_decode on compiled: asked off"),
    ("compile_off", "torch.compile: not compared", "none", "compile on compiled: asked on, the server resolved off"),
])
def test_thread05_unverified_or_different_states_lower_or_void_the_finding(tmp_path, stub_engine, mode, title, conf,
                                                                          says):
    """Unknown is never equal: a side that reports nothing is 'not verified' (confidence at most low); a side that
    also changed graphs is named; a side that did not resolve compile as asked voids the comparison."""
    engine = {**stub_engine, "env": {"STUB_STATE": mode}}
    load = {"concurrency": [2], "num_requests": 6, "output_len": 8, "warmup_requests": 0}
    (f,) = t05.findings(t05.run(context(engine, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path)),
                                exclusion=False))
    assert f.title == title and f.confidence == conf and says in f.claim, f.claim
    assert f.applies == (mode != "compile_off")


def test_thread05_bad_input_fails_before_launch(tmp_path):
    with pytest.raises(Exception, match="no engine named 'sglangx'"):
        t05.run(context({"name": "sglangx"}, {"tiny": {}}, {}, store_dir=str(tmp_path)))
    with pytest.raises(Exception, match="concurrency"):
        t05.run(context({"name": "vllm"}, {"tiny": {}}, {"concurrency": [0]}, store_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


def test_thread05_nothing_measured_says_so(tmp_path, stub_engine):
    cs = t05.run(context(stub_engine, {"path": "stub"}, {"concurrency": [1]}, repetitions=1,
                         store_dir=str(tmp_path), offline=True), exclusion=False)
    (f,) = t05.findings(cs)
    assert not f.applies and f.confidence == "none" and f.effect is None
    assert "NotMeasuredError" in f.reason


def test_store_keys_of_defaults_are_stable():
    """Changing a spec default changes what stored points mean: this pins the defaults' key.

    If it fails, you changed a default of Knobs/LoadSpec/ModelSpec/TinyModelSpec; put the old value back and add
    a new field instead, or re-record data/reference (see its README) and update the key here."""
    from servescope.experiment import point_parts

    parts = point_parts(context(EngineSpec(), ModelSpec(tiny={}), LoadSpec()), Knobs(), 0)
    assert parts["knobs"] == {} and parts["load"] == {}
    # bfloat16 (issue 20: vLLM CPU served the float32 model in bfloat16 anyway), no EOS in the generation config
    assert Store.key(parts) == "b2b276ef2ad94ba5"


def test_thread02_picks_the_mode_that_helps_most(tmp_path, stub_engine):
    """Known answer: the stub's inter-token gap shrinks most with piecewise graphs (tests/stub_engine.py GRAPH_SPEED);
    every mode resolves as asked; the thread recommends piecewise in the engine's spelling."""
    from servescope.threads import graph_modes as t02

    load = {"concurrency": [2], "num_requests": 8, "output_len": 16, "warmup_requests": 0}
    # room for the repetitions a noisy host asks for (a CI run beside the real engine read full's effect as medium
    # after three): the thread goes on while an effect is not resolved, as a suite's plan lets it
    gs = t02.run(context(stub_engine, {"path": "stub"}, load, repetitions=3, max_repetitions=5,
                         store_dir=str(tmp_path)))
    assert list(gs.modes["mode"][gs.modes["expressible"]]) == ["off", "decode_only", "full", "piecewise"]
    assert list(gs.modes_table()) == ["mode", "expressible", "flags", "reason"]  # 'asked' is the code's, not the page's
    assert set(gs.study.verification()["status"]) == {"as requested"}
    head, ceiling, *per_mode = t02.findings(gs)
    assert head.title == "Use CUDA graphs: piecewise" and head.recommended_flags == ["--itl-ms", "2"]
    assert ceiling.title == "Graph ceiling: not measured"  # the stub's model has no layer shapes
    assert [f.effect.treatment for f in per_mode] == ["decode_only", "full", "piecewise"]
    assert all(f.direction == "better" for f in per_mode)
    assert all(f.confidence == "high" for f in per_mode), [(f.title, f.confidence) for f in per_mode]
    assert gs.plot_effects() is not None and len(gs.effects()) == 9  # three modes x three metrics


def test_thread02_without_graph_modes_launches_only_the_defaults_point(tmp_path, stub_engine, monkeypatch):
    """An engine that can express no graph mode: one engine-defaults point (thread 1's key), and a finding that says
    why, which counts as an answer."""
    from servescope.errors import KnobError
    from servescope.threads import graph_modes as t02
    from stub_engine import StubAdapter

    def no_graphs(self, knobs, install):
        if knobs.cuda_graph not in (None, "off"):
            raise KnobError("stub 0.0: this platform has no CUDA graphs")
        return ["--itl-ms", "1"]

    monkeypatch.setattr(StubAdapter, "knob_flags", no_graphs)
    load = {"concurrency": [1], "num_requests": 2, "output_len": 4, "warmup_requests": 0}
    gs = t02.run(context(stub_engine, {"path": "stub"}, load, repetitions=3, store_dir=str(tmp_path)))
    assert [a.name for a in gs.study.arms] == ["engine default"] and len(gs.study.results.points) == 1
    f, ceiling = t02.findings(gs)
    assert f.title == "No CUDA graph modes to compare here" and not f.applies and f.answers
    # the stub's model has no layer shapes to build the ceiling probe from: said, not guessed
    assert ceiling.title == "Graph ceiling: not measured" and "layer shapes are not readable" in ceiling.claim
    assert "this platform has no CUDA graphs" in f.claim and "resolved CUDA graphs off" in f.claim


def test_the_cpu_ceiling_probe_times_only_the_batches_the_load_reaches(tmp_path, stub_engine):
    """Batch 256 took half of the CPU probe's 29 s in a cold make report whose load stops at c=16: on a CPU the probe
    runs 1 and 16 and any larger batch only where the load reaches it; on a GPU every batch, as recorded."""
    from servescope.threads import graph_modes as t02

    def ctx(load):
        return context(stub_engine, {"path": "stub"}, load, store_dir=str(tmp_path))

    assert t02.ceiling_batches("cpu", ctx({"concurrency": [1, 4, 16]})) == [1, 16]
    assert t02.ceiling_batches("cpu", ctx({"concurrency": [1, 4]})) == [1, 16]
    assert t02.ceiling_batches("cpu", ctx({"concurrency": [8, 256], "num_requests": 256})) == [1, 16, 256]
    assert t02.ceiling_batches("cpu", ctx({"mode": "open", "request_rate": [4]})) == [1, 16, 256]  # no cap: all
    assert t02.ceiling_batches("cuda", ctx({"concurrency": [1]})) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_repetitions_go_on_while_a_headline_is_unresolved_and_stop_at_the_plan(tmp_path, stub_engine):
    from servescope.experiment import RepetitionPlan

    cfgs = [Config("a", Knobs()), Config("b", Knobs(torch_compile=False))]
    asked: list[int] = []

    def never_resolved(res):
        asked.append(len(res.points))
        return {"b", "a"}

    res = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, store=Store(tmp_path / "s1"), say=lambda m: None,
                  plan=RepetitionPlan(3, 5), until=never_resolved)
    assert sorted(res.points["rep"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4] and asked == [6, 8]
    assert res.stopped == "max_repetitions=5 reached" and res.planned == 10
    done = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, store=Store(tmp_path / "s2"), say=lambda m: None,
                   plan=RepetitionPlan(3, 5), until=lambda res: set())
    assert len(done.points) == 6 and done.stopped == "resolved after 3 repetitions"
    only_b = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, store=Store(tmp_path / "s3"), say=lambda m: None,
                     plan=RepetitionPlan(1, 2), until=lambda res: {"b"})
    assert only_b.points.groupby("config").size().to_dict() == {"a": 1, "b": 2}  # the extra repetition: b alone
    budget = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, store=Store(tmp_path / "s4"), say=lambda m: None,
                     plan=RepetitionPlan(1, 5, budget_s=0.01), until=never_resolved)
    assert len(budget.points) == 2 and budget.stopped.startswith("time budget spent")
    # offline, the same store gives the same repetitions and the measuring run's reason
    again = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, store=Store(tmp_path / "s4"), say=lambda m: None,
                    plan=RepetitionPlan(1, 5, budget_s=0.01), until=never_resolved, offline=True)
    assert len(again.points) == 2 and again.stopped == budget.stopped and again.errors.empty


def test_one_launch_per_configuration_across_knobs_that_launch_the_same_server(tmp_path, stub_engine):
    """Knobs(torch_compile=True) launches the stub exactly as Knobs() does (compile is its default): one
    measurement per repetition, read under both names, also offline."""
    store = Store(tmp_path)
    said: list[str] = []
    first = measure(EngineSpec(**stub_engine), MODEL, [Config("defaults", Knobs())], LOAD, repetitions=2,
                    store=store, say=said.append)
    second = measure(EngineSpec(**stub_engine), MODEL, [Config("compiled", Knobs(torch_compile=True)),
                                                         Config("eager", Knobs(torch_compile=False))], LOAD,
                     repetitions=2, store=store, say=said.append)
    launched = [m for m in said if "launching" in m]
    assert len(launched) == 4  # defaults x2, eager x2: compiled is the defaults' launch
    assert sum("the same launch as stored point" in m for m in said) == 2
    a = first.summary.sort_values(["rep", "concurrency"])["output_tok_s"].tolist()
    b = second.summary[second.summary["config"] == "compiled"].sort_values(["rep", "concurrency"])
    assert b["output_tok_s"].tolist() == a
    offline = measure(EngineSpec(**stub_engine), MODEL, [Config("compiled", Knobs(torch_compile=True))], LOAD,
                      repetitions=2, store=store, offline=True, say=lambda m: None)
    assert offline.errors.empty and len(offline.points) == 2
    assert len(store.keys()) == 4  # folders: one per launch


def test_an_armed_profiler_the_engine_leaves_idle_is_the_same_launch_for_the_load(tmp_path, stub_engine, monkeypatch):
    """The default suite's 02 arms vLLM 0.32's torch profiler and profiles a window after its load; 04 and 05 read
    that launch as their first repetition of the defaults, 06 its profile (a launch of its own cost about 50 s of
    a cold make report). Only where the adapter shows the armed profiler inert: otherwise (nsys, an engine not read)
    the armed launch stays another launch, and a profiled point is never read from an unprofiled one."""
    import json

    from servescope.experiment import _shared_point, launch_identity, point_parts
    from servescope.launch import prepare
    from servescope.spec import ProfileSpec
    from stub_engine import StubAdapter

    ctx = context(stub_engine, {"path": "stub"}, LOAD, store_dir=str(tmp_path), profile={"kind": "torch"})
    plain_ctx = ctx.with_(profile=ProfileSpec())
    prep = prepare(ctx.engine, ctx.model, lambda m: None, adapter=ctx.adapter)
    cfg = Config("defaults", Knobs())
    armed, plain = point_parts(ctx, Knobs(), 0), point_parts(plain_ctx, Knobs(), 0)
    nsys = point_parts(ctx.with_(profile=ProfileSpec(kind="nsys")), Knobs(), 0)
    assert "profile" in armed and ctx.store.key(armed) != ctx.store.key(plain)  # two points, whatever the engine

    def ident(parts):
        return launch_identity(prep, cfg, parts, ctx.adapter)

    assert ident(armed) != ident(plain)  # not shown inert: another launch
    monkeypatch.setattr(StubAdapter, "idle_profiler_inert",
                        lambda self, install, kind: "built on the first start" if kind == "torch" else "")
    assert ident(armed) == ident(plain) and ident(nsys) != ident(plain)
    k_armed, k_plain = ctx.store.key(armed), ctx.store.key(plain)
    assert _shared_point(ctx, k_armed, armed, prep, cfg) is None  # the profiled point is launched (and indexed)
    (tmp_path / k_armed).mkdir()
    (tmp_path / k_armed / "manifest.json").write_text(json.dumps({"status": "complete"}))
    assert _shared_point(plain_ctx, k_plain, plain, prep, cfg) == k_armed  # the load's point reads it
    assert ctx.store.resolve(k_plain) == k_armed
    # the other way round: a profiled point is launched even where the same launch was measured without a profile
    other = point_parts(ctx, Knobs(), 1)
    plain1 = point_parts(plain_ctx, Knobs(), 1)
    assert _shared_point(plain_ctx, ctx.store.key(plain1), plain1, prep, cfg) is None
    (tmp_path / ctx.store.key(plain1)).mkdir()
    (tmp_path / ctx.store.key(plain1) / "manifest.json").write_text(json.dumps({"status": "complete"}))
    assert _shared_point(ctx, ctx.store.key(other), other, prep, cfg) is None


def test_a_run_budget_launches_no_point_that_would_not_finish_and_a_later_run_goes_on(tmp_path, stub_engine,
                                                                                      monkeypatch):
    """The vLLM H200 calls each lost a launch (95-150 s of a 10-minute call) to the budget's SIGTERM, ready a second
    before it came. With the run's budget set (servescope run --budget-s), a point that would not finish within it, by
    the longest a point like it took in the store, is not launched: not measured and not failed, the repetitions stop
    there, and a later run launches it."""
    import time

    from servescope.experiment import DEADLINE_ENV

    store = Store(tmp_path)
    a, b = Config("a", Knobs()), Config("b", Knobs(torch_compile=False))
    measure(EngineSpec(**stub_engine), MODEL, [a], LOAD, repetitions=1, store=store, say=lambda m: None)
    took = store.longest_point_s(next(store.points()).parts)
    assert took is not None and took > 0
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + took / 2))
    said: list[str] = []
    res = measure(EngineSpec(**stub_engine), MODEL, [a, b], LOAD, repetitions=2, store=store, say=said.append)
    assert len(store.keys()) == 1  # nothing launched
    assert res.errors["error_type"].tolist() == ["NotLaunchedError", "NotLaunchedError"]
    assert sorted(zip(res.errors["config"], res.errors["rep"], strict=True)) == [("a", 1), ("b", 0)]
    o = res.outcome("t", [])
    assert (o.points_planned, o.points_measured, o.points_failed, o.points_unmeasured) == (3, 1, 0, 2)
    assert "--budget-s" in res.stopped and "a later run goes on" in res.stopped
    assert any("not launched: the run's budget (--budget-s) ends in" in m for m in said)
    # an offline render of that store counts the same points as asked and not in it (the SGLang H100 reference's 02
    # read "ok" offline while the GPU run said "partial", and 07 then said no change was recommended)
    off = measure(EngineSpec(**stub_engine), MODEL, [a, b], LOAD, repetitions=2, store=store, offline=True,
                  say=lambda m: None)
    o = off.outcome("t", [])
    assert (o.points_planned, o.points_measured, o.points_unmeasured) == (3, 1, 2), off.errors
    assert off.stopped == res.stopped
    # a budget already spent launches nothing, even where the store has nothing to judge a launch by
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() - 1))
    empty = measure(EngineSpec(**stub_engine), MODEL, [a], LOAD, repetitions=1, store=Store(tmp_path / "e"),
                    say=lambda m: None)
    assert empty.errors["error_type"].tolist() == ["NotLaunchedError"] and not Store(tmp_path / "e").keys()
    monkeypatch.delenv(DEADLINE_ENV)
    again = measure(EngineSpec(**stub_engine), MODEL, [a, b], LOAD, repetitions=2, store=store, say=lambda m: None)
    assert again.errors.empty and len(store.keys()) == 4
