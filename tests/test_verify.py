"""Thread 07: the run's recommended changes composed (rank order, clashes, the engine's exclusion rules), measured
together against the baseline on the stub engine with known answers (compile off makes the stub 4x slower per token;
STUB_MAX_RUNNING caps its running requests unless max_running_requests is set), each change's share, the scheduler
search and its verification, the front page's first line and one improvement document per change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope import nb
from servescope.context import context
from servescope.errors import SpecError
from servescope.findings import Change, Conflict, Effect, Finding, collect, write_findings
from servescope.spec import Knobs
from servescope.store import Store
from servescope.summary import front_line
from servescope.threads import change_docs
from servescope.threads import verify as t07

LOAD = {"concurrency": [2, 8], "num_requests": 16, "output_len": 8, "warmup_requests": 0}


def _finding(thread: str, title: str, knobs: dict, conf: str, pct: float, flags: list[str] | None = None) -> Finding:
    eff = Effect(metric="output_tok_s", value_pct=pct, ci_low_pct=pct / 2, ci_high_pct=pct * 1.5, n=3, at="at c=8")
    return Finding(kind="effect", thread=thread, title=title, headline=f"{title} helps: {pct:+.0f}%", effect=eff,
                   confidence=conf, direction="better",
                   change=Change(knobs=Knobs(**knobs), flags=flags or [f"--{k}={v}" for k, v in knobs.items()]))


def _report(tmp: Path, *extra: tuple[str, list[Finding]]) -> Path:
    d = tmp / "report"
    d.mkdir()
    for thread, fs in extra:
        write_findings(fs, d / f"{thread}.findings.json")
    return d


def test_changes_compose_in_rank_order_and_say_why_one_is_left_out(tmp_path):
    d = _report(tmp_path,
                ("05_torch_compile", [_finding("05_torch_compile", "torch.compile", {"torch_compile": True}, "high", 40),
                                      # reworded on purpose: 07 acts on the verdict, never on the words
                                      Finding(thread="05_torch_compile",
                                              title="Compile and piecewise graphs do not run together",
                                              kind="rule",
                                              headline="With compile on, the piecewise request resolved to off",
                                              confidence="high", change=Change(
                                                  knobs=Knobs(torch_compile=True),
                                                  excludes=[Conflict(knobs={"cuda_graph": "piecewise"},
                                                                     why="Compile and piecewise graphs do not run "
                                                                         "together")]))]),
                ("02_piecewise_cuda_graphs", [
                    _finding("02_piecewise_cuda_graphs", "Use CUDA graphs: piecewise", {"cuda_graph": "piecewise"},
                             "medium", 25),
                    _finding("02_piecewise_cuda_graphs", "low one", {"cuda_graph": "full"}, "low", 90)]),
                ("04_data_parallelism", [_finding("04_data_parallelism", "compile off", {"torch_compile": False},
                                                  "medium", 10)]))
    by_thread = collect(d)
    found = t07.changes(by_thread)
    assert [c.title for c in found] == ["torch.compile", "Use CUDA graphs: piecewise", "compile off"]  # Low left out
    combined, found = t07.compose(Knobs(), found, t07.exclusion_rules(by_thread))
    assert combined == Knobs(torch_compile=True)
    assert found[1].excluded.startswith("excluded by a rule of this engine, the higher-ranked change wins: "
                                        "Compile and piecewise graphs do not run together")
    assert found[2].excluded == "sets torch_compile=False, which the higher-ranked --torch_compile=True sets to True"
    combined, _ = t07.compose(Knobs(), t07.changes(by_thread))  # without the rule both join
    assert combined == Knobs(torch_compile=True, cuda_graph="piecewise")


def test_the_changes_together_are_verified_with_each_ones_share(tmp_path, stub_engine):
    """Known answer: baseline compile off with the stub's running cap 2; compile on (High) and
    max_running_requests=8 (Medium) both help at c=8, so together they must be verified better, each with a
    positive share; a change that clashes is left out and still gets its document."""
    d = _report(tmp_path,
                ("05_torch_compile", [_finding("05_torch_compile", "torch.compile", {"torch_compile": True}, "high", 60)]),
                ("02_piecewise_cuda_graphs", [
                    _finding("02_piecewise_cuda_graphs", "Running cap", {"max_running_requests": 8}, "medium", 30),
                    _finding("02_piecewise_cuda_graphs", "Eager", {"torch_compile": False}, "medium", 5)]))
    eng = {**stub_engine, "env": {"STUB_MAX_RUNNING": "2"}}
    ctx = context(eng, {"path": "stub"}, LOAD, repetitions=3, max_repetitions=3, store_dir=str(tmp_path / "s"),
                  progress=False, baseline={"torch_compile": False})
    # a thread that did not finish is named (its change may be missing); 07's own earlier outcome is not
    v = t07.run(ctx, collect(d),
                unfinished={"06_moe_grouped_gemm": "partial: 2 of 3 points measured, 1 failed",
                            "07_verified_changes": "no result: no finding states an answer"})
    assert v.combined == Knobs(torch_compile=True, max_running_requests=8)
    fs = t07.findings(v)
    head = fs[0]
    assert head.title.startswith("Verified: the recommended changes together, +") and head.confidence == "high"
    assert head.effect is not None and head.effect.n == 3 and head.effect.ci_low_pct > 0
    line = front_line(fs)
    assert line.startswith("Verified: +") and "against the baseline torch_compile=False" in line
    shares = v.shares().set_index("change")
    assert len(shares) == 2 and (shares["share_pct"] > 0).all() and shares["resolved"].all()
    assert "Left out: --torch_compile=False (sets torch_compile=False, which the higher-ranked" in head.claim
    assert "Not finished, so a change it would name may be missing here: 06_moe_grouped_gemm (partial: 2 of 3 points " \
           "measured, 1 failed)." in head.claim and "07_verified_changes" not in head.claim
    assert fs[1].title == "Scheduler tuning: not searched"
    docs = nb.write_documents(change_docs.documents(v, fs), d)
    # the third change sets the same knob as the first otherwise: an alternative, said in the first one's document
    assert [p.parent.name for p in docs] == ["changes"] * 2
    text = docs[0].read_text()
    for part in ("## What was found", "## The change", "## Effect", "## What it excludes or risks", "## Roll back",
                 "(../05_torch_compile.html#Answer)", "Its share (the combination against it left out): +"):
        assert part in text, part
    assert "Measured alternative, not taken: --torch_compile=False" in text
    offline = t07.run(context(eng, {"path": "stub"}, LOAD, repetitions=3, store_dir=str(tmp_path / "s"),
                              offline=True, progress=False, baseline={"torch_compile": False}), collect(d))
    assert t07.findings(offline)[0].title == head.title  # rendered again from the store alone


def test_the_scheduler_search_finds_and_verifies_a_setting(tmp_path, stub_engine):
    """Known answer: no recommended change, the stub capped at 2 running requests by default; at c=8 every larger
    max_running_requests is faster, so the search must pick one and verify it against the engine's defaults. Both
    levels (c=4, 8) are above the cap: at a level below it the effect is zero and noise alone would decide its sign.
    Tokens 20 ms apart: with the stub's 1 ms a launch lasted ~0.1 s and one hiccup of the 2-core host under the full
    suite turned a 4x faster setting into -76% (CI at b3d4aa7)."""
    d = _report(tmp_path)
    eng = {**stub_engine, "env": {"STUB_MAX_RUNNING": "2", "STUB_ITL_MS": "20"}}
    ctx = context(eng, {"path": "stub"}, {**LOAD, "concurrency": [4, 8]}, repetitions=3, max_repetitions=3,
                  store_dir=str(tmp_path / "s"), progress=False)
    v = t07.run(ctx, collect(d), search=["max_running_requests"], search_budget_s=120)
    # below the level (8) only: a cap at or above it holds nothing back; 2 is the stub's own cap
    assert list(v.search["setting"]) == ["(the engine's defaults)", "max_running_requests=2", "max_running_requests=4",
                                         "max_running_requests=6"]
    assert (v.search["vs_combined_pct"].iloc[2:] > 20).all()
    fs = t07.findings(v)
    assert fs[0].title == "Nothing to verify: no recommended change"
    assert fs[1].title.startswith("Verified scheduler setting: max_running_requests=") and fs[1].confidence == "high"
    assert front_line(fs).startswith("Verified: +") and "the engine's defaults" in front_line(fs)
    assert "(not verified: this run recommends no change" in front_line(fs)
    assert change_docs.documents(v, fs) == {}


def test_a_search_over_machine_starts_holds_each_setting_against_its_own_starts_reference(tmp_path, stub_engine,
                                                                                          monkeypatch):
    """A search its budget cut short goes on in a new machine start (a new GPU session continuing the store): that
    start launches its own reference, then the settings no earlier start measured (SGLang's H100 search, continued,
    launched the earlier start's settings again first and its last three never); each setting is held against the
    reference of its own start, and a finished search is read, not launched, in a later start and offline. Each stub
    launch is made to take 1.5 s, so the 1 s budget leaves time for one setting per start."""
    from servescope import store as store_mod
    from servescope.threads import verify as v_mod

    def on(boot: str) -> None:
        monkeypatch.setattr(store_mod, "boot_id", lambda: boot)
        monkeypatch.setattr(v_mod, "boot_id", lambda: boot)

    d = _report(tmp_path)
    eng = {**stub_engine, "env": {"STUB_READY_AFTER": "1.5"}}

    def run(offline: bool = False):
        ctx = context(eng, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1, store_dir=str(tmp_path / "s"),
                      progress=False, offline=offline)
        return t07.run(ctx, collect(d), search=["max_running_requests"], search_budget_s=1.0, verify_lead=False)

    def launched(boot: str) -> list[dict]:  # what a start launched, in order (the reference: {})
        pts = [pt for pt in Store(tmp_path / "s").points() if pt.parts.get("machine_start") == boot]
        return [pt.parts["knobs"] for pt in sorted(pts, key=lambda p: p.manifest["started_unix"])]

    runs = []
    for boot in ("boot-a", "boot-b", "boot-c"):
        on(boot)
        runs.append(run())
    assert [launched(b) for b in ("boot-a", "boot-b", "boot-c")] == [
        [{}, {"max_running_requests": m}] for m in (2, 4, 6)]
    assert runs[0].search["state"].tolist() == ["measured", "measured", "budget spent", "budget spent"]
    last = runs[-1]
    assert (last.search["state"] == "measured").all() and "launches" in last.search
    assert last.search["launches"].tolist() == [3, 1, 1, 1]
    assert "in each of the 3 machine starts the settings ran in" in last.tuning.note
    # each setting against its own start's reference: mrr=2 (boot-a) kept as the first run measured it
    two = runs[0].search.set_index("setting").loc["max_running_requests=2"]
    assert last.search.set_index("setting").loc["max_running_requests=2", "vs_combined_pct"] == two["vs_combined_pct"]
    on("boot-d")  # finished: read in a later start, nothing launched
    later, offline = run(), run(offline=True)
    assert launched("boot-d") == []
    for again in (later, offline):
        assert again.search.drop(columns="flags").equals(last.search.drop(columns="flags"))


def test_a_setting_measured_in_several_machine_starts_shows_the_mean_of_its_leads_and_their_range():
    """Two starts' rows of one setting become one: the mean of its leads (each against its own start's reference),
    their range and the count; a setting measured in none keeps what became of it, a failed launch before a later
    start's budget words."""
    R = t07.SearchRow
    a = [R("(ref)", "measured", output_tok_s=100.0, vs_combined_pct=0.0, reference=True, launches=1),
         R("x=1", "measured", output_tok_s=50.0, vs_combined_pct=-50.0, launches=1),
         R("y=1", "failed", "it died")]
    b = [R("(ref)", "measured", output_tok_s=200.0, vs_combined_pct=0.0, reference=True, launches=1),
         R("x=1", "measured", output_tok_s=120.0, vs_combined_pct=-40.0, launches=1),
         R("y=1", "budget spent")]
    rows = {r.setting: r for r in t07._merged([a, b], ["(ref)", "x=1", "y=1"])}
    assert (rows["x=1"].vs_combined_pct, rows["x=1"].launches, rows["x=1"].low_pct, rows["x=1"].high_pct) == \
        (-45.0, 2, -50.0, -40.0)
    assert rows["(ref)"].output_tok_s == 150.0 and rows["(ref)"].launches == 2
    assert rows["y=1"].state == "failed"
    assert t07._lead_words(rows["x=1"]) == "x=1 mean -45.0% (2 starts: -50.0..-40.0%)"
    # the page's table: a count where launched, blank where not (a missing count must not break the page)
    search = t07.Search(list(rows.values()), note="", level=8, floor_pct=5.0, floor_why="", floor_from_spread=False)
    table = search.table()
    assert table["vs_combined_range_pct"].tolist() == ["", "-50.0..-40.0", ""]
    assert table["launches"].iloc[:2].tolist() == [2, 2] and table["launches"].isna().iloc[2]
    assert nb.table_or(table, "") is not None


def test_the_search_waits_for_an_unfinished_thread_that_may_name_the_change(tmp_path, stub_engine):
    """SGLang's H100 store: 02 cut short by the device budget, so no change is recommended yet; a search around the
    graphs-off deployment would tune what 02's change replaces. Nothing is launched and both findings say why."""
    ctx = context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    v = t07.run(ctx, collect(_report(tmp_path)), search=["max_running_requests"], search_budget_s=60,
                unfinished={"02_piecewise_cuda_graphs": "partial: 5 of 6 points measured, 1 not in the store"})
    assert v.tuning is None and not Store(tmp_path / "s").keys()
    head, tuning = t07.findings(v)
    assert head.title == "Not verified: an earlier thread did not finish"
    assert tuning.title == "Scheduler tuning: waits for an earlier thread"
    assert "02_piecewise_cuda_graphs (partial: 5 of 6 points measured" in tuning.headline


def test_a_screening_search_names_its_lead_and_launches_nothing_to_verify_it(tmp_path, stub_engine):
    """verify_lead=False (the default suite: verifying a lead there cost 3 launches of the whole load, about 180 s of
    a cold make report): the same known answer as above leads by >20% and is named, but no verification is launched,
    and the front line's scheduler half reads the same whether a setting led or none did (the chunked-prefill knob
    the stub ignores), so that a lead found by chance in one launch cannot change the first line of a second run."""
    eng = {**stub_engine, "env": {"STUB_MAX_RUNNING": "2", "STUB_ITL_MS": "20"}}
    ctx = context(eng, {"path": "stub"}, {**LOAD, "concurrency": [4, 8]}, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    v = t07.run(ctx, collect(_report(tmp_path)), search=["max_running_requests"], search_budget_s=120, search_settings=2,
                verify_lead=False)
    assert v.tuning.tuned is None and len(v.studies()) == 3  # the reference and two settings, one launch each: no more
    assert v.tuning.lead is not None and v.tuning.lead[0].startswith("max_running_requests=") and v.tuning.lead[1] > 20
    fs = t07.findings(v)
    assert fs[1].title == "Scheduler tuning: screened, not verified" and fs[1].confidence == "low"
    assert f"{v.tuning.lead[0]} led by {v.tuning.lead[1]:+.1f}% in its one launch" in fs[1].claim
    assert "not verified here" in fs[1].claim
    (tmp_path / "n").mkdir()
    none = t07.run(ctx, collect(_report(tmp_path / "n")),
                   search=["chunked_prefill_size"], search_budget_s=120, search_settings=2, verify_lead=False)
    nfs = t07.findings(none)
    assert none.tuning.lead is None and "None led by more than" in nfs[1].claim
    assert front_line(fs) == front_line(nfs) == (
        "Not verified: this run recommends no change to verify (no High or Medium finding names one); no scheduler "
        "setting was verified: this suite's search only screens (2 settings at c=8, one launch each, verify_lead: "
        "false)")
    # verifying (the default) the same lead launches its repetitions: the flag is what saved them
    (tmp_path / "o").mkdir()
    on = t07.run(ctx, collect(_report(tmp_path / "o")), search=["max_running_requests"], search_budget_s=120,
                 search_settings=2)
    assert on.tuning.tuned is not None


def test_a_search_budget_spent_says_what_was_not_tried(tmp_path, stub_engine):
    ctx = context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    # 0.3 s: room for the first setting however slow the host (a 1 ms budget let a CI run's busy host spend it
    # before the first launch), none for a second after it (a stub launch and its load take longer)
    v = t07.run(ctx, collect(_report(tmp_path)), search=["max_running_requests"], search_budget_s=0.3)
    assert (v.search["status"].iloc[2:] == "not tried: search budget spent").all()
    # offline, the same settings read as the measuring run left them: nothing fails for want of a launch
    off = t07.run(ctx.with_(offline=True), collect(tmp_path / "report"), search=["max_running_requests"],
                  search_budget_s=0.3)
    assert off.search["status"].tolist() == v.search["status"].tolist()
    fs = t07.findings(off)
    assert off.outcome(fs).points_failed == 0 and off.outcome(fs).points_measured == 2
    assert off.outcome(fs).points_unmeasured == 0  # a spent budget is what the run said, not a gap in the store
    with pytest.raises(SpecError, match="search: knobs to search are"):
        t07.run(ctx, collect(tmp_path), search=["max_batch"], search_budget_s=10)


def test_a_setting_launched_as_the_search_was_stopped_is_read_not_said_untried(tmp_path, stub_engine, monkeypatch):
    """The vLLM H200 run was stopped (its call's budget) while the search, continued, launched one more setting: the
    point was in the store, the search's note still said "not tried: search budget spent", and the offline render
    said so. A setting whose point the store holds is read as measured."""
    ctx = context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    args = {"search": ["max_running_requests"], "search_budget_s": 0.001}
    v = t07.run(ctx, collect(_report(tmp_path)), **args)
    assert (v.search["status"].iloc[2:] == "not tried: search budget spent").all()
    (note,) = (tmp_path / "s" / "_notes" / "verify_search").glob("*.json")
    said = note.read_text()
    monkeypatch.setattr(t07.time, "monotonic", lambda: 0.0)  # the continued run: time for every setting
    t07.run(ctx, collect(tmp_path / "report"), **args)
    monkeypatch.undo()
    note.write_text(said)  # ... stopped before the search wrote what it tried
    off = t07.run(ctx.with_(offline=True), collect(tmp_path / "report"), **args)
    assert (off.search["status"].iloc[1:] == "measured").all(), off.search["status"].tolist()
    assert len(off.search) == len(v.search)


def test_a_search_by_count_tries_the_same_settings_whatever_the_launches_take(tmp_path, stub_engine):
    """Two cold runs of the default suite searched for 90 s: one had time for 1 setting, the other for 2, and only the
    second verified one, so their first lines differed. With search_settings the settings tried are the first N of
    the grid in both runs, however long a launch takes; a rerun does not go on past N, and offline reads the same."""
    with pytest.raises(SpecError, match="search_settings"):
        t07.run(context(stub_engine, {"path": "stub"}, LOAD, store_dir=str(tmp_path / "x"), progress=False),
                collect(tmp_path), search=["max_running_requests"], search_budget_s=60, search_settings=-1)
    statuses = []
    for i, slow in enumerate(("0", "1.5")):  # a fast host and a slow one
        eng = {**stub_engine, "env": {"STUB_READY_AFTER": slow}}
        ctx = context(eng, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                      store_dir=str(tmp_path / f"s{i}"), progress=False)
        (tmp_path / f"r{i}").mkdir()
        report = _report(tmp_path / f"r{i}")
        v = t07.run(ctx, collect(report), search=["max_running_requests"], search_budget_s=600, search_settings=2)
        statuses.append(v.search.set_index("setting")["status"].to_dict())
        again = t07.run(ctx, collect(report), search=["max_running_requests"], search_budget_s=600, search_settings=2)
        assert again.search["status"].tolist() == v.search["status"].tolist()  # finished: not continued
        off = t07.run(ctx.with_(offline=True), collect(report), search=["max_running_requests"], search_budget_s=600,
                      search_settings=2)
        assert off.search["status"].tolist() == v.search["status"].tolist()
        assert "at most 2 settings" in v.tuning.note
    assert statuses[0] == statuses[1]
    assert list(statuses[0].values()) == ["measured", "measured", "measured", t07.COUNT_REACHED]


def test_no_setting_that_beats_the_defaults_is_said_and_not_verified(tmp_path, stub_engine):
    """The stub ignores the batch-token knob: every setting is the same launch, so none leads and none is verified;
    the front line says so."""
    ctx = context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    v = t07.run(ctx, collect(_report(tmp_path)), search=["chunked_prefill_size"], search_budget_s=60)
    assert v.tuning.tuned is None and (v.search["vs_combined_pct"] == 0).all()
    fs = t07.findings(v)
    assert fs[1].title == "Scheduler tuning: no setting beat the engine's defaults"
    assert front_line(fs) == ("Not verified: this run recommends no change to verify (no High or Medium finding "
                                  "names one); no scheduler setting was verified: none of the 3 tried at c=8 beat the "
                                  "engine's defaults by more than 5%")


def test_a_search_lead_that_does_not_hold_up_is_said_so(tmp_path, stub_engine):
    """Known answer: the stub's first launch asking for batch tokens runs 4x faster (STUB_FAST_ONCE) and every later
    one is the defaults' launch, so the search's one-launch lead must vanish when verified with repetitions."""
    once = tmp_path / "once"
    once.touch()
    eng = {**stub_engine, "env": {"STUB_FAST_ONCE": str(once)}}
    load = {**LOAD, "output_len": 32}
    ctx = context(eng, {"path": "stub"}, load, repetitions=3, max_repetitions=3, store_dir=str(tmp_path / "s"),
                  progress=False, baseline={"torch_compile": False})
    v = t07.run(ctx, collect(_report(tmp_path)), search=["chunked_prefill_size"], search_budget_s=60)
    assert v.search.set_index("setting").loc["chunked_prefill_size=512", "vs_combined_pct"] > 50
    fs = t07.findings(v)
    assert fs[1].title.startswith("Scheduler tuning: the search's lead chunked_prefill_size=512 did not hold up (")
    # the same launch on both sides: no gain left (a loaded test host has read one side 10% slower, resolved: the
    # host's noise, not the knob's, and no lead either way)
    assert fs[1].effect is not None and fs[1].effect.n == 3 and fs[1].effect.value_pct < 10
    # it opens as a search whose lead never cleared the floor does: a second run reads the same first words
    assert "no scheduler setting was verified: the search's lead, chunked_prefill_size=512, did not hold up when " \
        "verified (" in front_line(fs)


def test_a_search_stopped_by_its_budget_goes_on_where_it_stopped(tmp_path, stub_engine):
    """The H200's search tried 4 of 11 settings in its 300 s; run again online with the same budget, it must go on with
    those it had no time for (the ones it launched come back from the store at no cost), not read the first run's
    answer back. A budget shorter than one stub launch (each is made to take 1.5 s, so that neither this host's speed
    nor the store's reads decide it): each run has time for one new launch."""
    eng = {**stub_engine, "env": {"STUB_READY_AFTER": "1.5"}}
    ctx = context(eng, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)

    def points() -> int:  # the search's launches: its one level, c=8
        return sum(json.loads(m.read_text())["parts"]["load"]["concurrency"] == [8]
                   for m in (tmp_path / "s").glob("[0-9a-f]*/manifest.json"))

    runs, counts = [], []
    for i in range(3):
        runs.append(t07.run(ctx, collect(_report(tmp_path) if i == 0 else tmp_path / "report"), search=["max_running_requests"],
                            search_budget_s=1.0))
        counts.append(points())
    measured = [int((r.search["status"] == "measured").sum()) for r in runs]  # the reference's row included
    assert measured == [2, 3, 4], [r.search["status"].tolist() for r in runs]
    assert counts == [2, 3, 4]  # one new launch each time: nothing launched twice
    assert (runs[0].search["status"] == t07.BUDGET_SPENT).sum() == 2
    # offline, the finished search is what renders
    off = t07.run(ctx.with_(offline=True), collect(tmp_path / "report"), search=["max_running_requests"], search_budget_s=1.0)
    assert off.search["status"].tolist() == runs[-1].search["status"].tolist()


def test_points_an_offline_render_lacks_are_not_in_the_store_not_failed():
    """A render of an incomplete store (a recording stopped by its budget) lacks points it asked for: the thread is
    partial, and the index says they are not in the store, not that they failed; none measured at all is failed."""
    from servescope.findings import Outcome

    o = Outcome(thread="t", points_planned=19, points_measured=11, points_unmeasured=8, findings_answering=1)
    assert o.status() == "partial" and o.summary() == "11 of 19 points measured, 8 not in the store"
    both = o.model_copy(update={"points_failed": 1, "points_planned": 20})
    assert both.summary() == "11 of 20 points measured, 1 failed, 8 not in the store"
    assert Outcome(thread="t", points_planned=2, points_unmeasured=2, findings_answering=1).status() == "failed"


def test_a_configuration_that_dies_at_launch_with_the_engines_exception_is_an_answer_not_a_gap():
    """A point whose server died before it was ready with the engine's own exception leaves the thread ok (that
    configuration cannot run here: the answer for it, which its findings state); a death while serving, or one before
    ready without the engine's exception (a hang, a kill), leaves it partial; notebooks say it without the red block."""
    import pandas as pd

    from servescope.experiment import ERROR_COLUMNS, Results
    from servescope.findings import Outcome

    def row(config: str, error_type: str, before_ready: bool, exception: str) -> dict:
        return {**dict.fromkeys(ERROR_COLUMNS, ""), "config": config, "rep": 1, "error_type": error_type,
                "summary": f"{error_type}: x", "before_ready": before_ready, "exception": exception}

    capture = row("full", "RecordedFailure", True, "ValueError: Invalid forward mode")
    res = Results(summary=pd.DataFrame(), requests=pd.DataFrame(), startup=pd.DataFrame(),
                  points=pd.DataFrame({"config": ["off", "piecewise"]}), errors=pd.DataFrame([capture]), planned=3)
    o = res.outcome("t", [])
    assert (o.points_failed, o.points_died, o.status()) == (1, 1, "no result")  # no finding answers yet
    o = o.model_copy(update={"findings_answering": 1})
    assert o.status() == "ok"
    assert o.summary() == "2 of 3 points measured, 1 died at launch (a finding)"
    said = nb.show_measured(res).data
    assert said.startswith("2 of 3 points measured, 1 died at launch") and "First error" not in said
    for other in (row("eager", "ServerDiedError", False, "RuntimeError: x"),  # while serving
                  row("full", "ServerStartTimeout", True, ""),  # a hang before ready: no exception of the engine's
                  row("full", "NotMeasuredError", True, "ValueError: x")):  # offline, not in the store
        res.errors = pd.DataFrame([capture, other])
        o = res.outcome("t", []).model_copy(update={"findings_answering": 1})
        assert o.points_died == 1 and o.status() == "partial", other["error_type"]
        assert nb.show_measured(res).data.startswith("**Partly measured:")
    assert Outcome(thread="t", points_planned=2, points_failed=2, points_died=2, findings_answering=1).status() == \
        "failed"  # nothing measured is failed whatever the cause


def test_a_search_stopped_by_the_runs_budget_says_so_and_goes_on_in_a_later_run(tmp_path, stub_engine, monkeypatch):
    """A setting the run's budget (--budget-s) left unlaunched is neither failed nor 'not tried by the measuring run':
    the search says the run's budget ended first and, run again online, launches it."""
    import time

    from servescope.experiment import DEADLINE_ENV

    ctx = context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, max_repetitions=1,
                  store_dir=str(tmp_path / "s"), progress=False)
    args = {"search": ["max_running_requests"], "search_budget_s": 600, "verify_lead": False}
    first = t07.run(ctx, collect(_report(tmp_path)), **args)  # the reference and every setting: launch lengths known
    (tmp_path / "b").mkdir()
    wider = ctx.with_(load=ctx.load.model_copy(update={"num_requests": 24}))  # new points, each like those above
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 0.05))
    late = t07.run(wider, collect(_report(tmp_path / "b")), **args)
    words = "not tried: the run's budget (--budget-s) ended first"
    assert (late.search["status"] == words).all(), late.search["status"].tolist()  # the reference too
    fs = t07.findings(late)
    assert late.outcome(fs).points_failed == 0
    monkeypatch.delenv(DEADLINE_ENV)
    (tmp_path / "c").mkdir()
    on = t07.run(wider, collect(_report(tmp_path / "c")), **args)
    assert (on.search["status"] == "measured").all() and len(on.search) == len(first.search)


def test_a_change_document_gives_both_launch_commands_shell_quoted():
    """vLLM's graph change is a JSON flag: the 'after' command pastes into bash as one command (shlex), with the
    user's --enforce-eager taken out and nothing else moved."""
    import shlex
    from types import SimpleNamespace

    before = shlex.join(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--enforce-eager",
                         "--max-model-len", "8192"])
    point = SimpleNamespace(target={"command": before})
    v = SimpleNamespace(study=SimpleNamespace(results=SimpleNamespace(point=lambda name: point)))
    c = SimpleNamespace(flags=["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'],
                        drop_flags=["--enforce-eager"])
    lines = change_docs._commands(v, c)
    blocks = [lines[i + 1] for i, x in enumerate(lines) if x == "```bash"]
    assert blocks[0] == before
    after = shlex.split(blocks[1])
    assert "--enforce-eager" not in after and after[-1] == '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'
    assert after[:-2] == [x for x in shlex.split(before) if x != "--enforce-eager"]
    assert change_docs._commands(v, SimpleNamespace(flags=[], drop_flags=[])) == []


def test_the_search_refuses_settings_that_cannot_change_anything():
    """A knob the version's source never reads, and a running-request cap at or above the level, are not launched
    (said why); a cap at or above the level is launched where it lifts a lower cap the engine chose itself."""
    from servescope.threads.verify import _Frame

    f = _Frame(32, 100.0, unread={"num_continuous_decode_steps": "sglang 0.5.17 declares it and no file reads it"})
    assert f.refused("num_continuous_decode_steps=4") == (
        "not read", "no effect: sglang 0.5.17 declares it and no file reads it")
    assert f.refused("max_running_requests=32")[0] == "cannot bind"
    assert "at most 32 are in flight" in f.refused("max_running_requests=64")[1]
    assert f.refused("max_running_requests=16") is None and f.refused("chunked_prefill_size=512") is None
    assert f.refused("chunked_prefill_size=512 + num_continuous_decode_steps=2")[0] == "not read"  # a pair
    lifted = _Frame(32, 100.0, defaults={"max_running_requests": 8})
    assert lifted.refused("max_running_requests=32") is None


@pytest.mark.parametrize("engine,reference", [("sglang", "sglang-qwen3-30b-h100"), ("vllm", "vllm-qwen3-30b")])
def test_the_search_does_not_launch_the_value_the_reference_already_runs_with(engine, reference):
    """Both engines resolve the prefill chunk to 8,192 tokens at real size on an H100 (their recorded server info):
    the grid's 8,192 is the reference launched once more, so it is said and not launched; 2,048 is launched."""
    from servescope.engines import get_engine
    from servescope.threads.verify import _Frame

    root = Path(__file__).resolve().parents[1] / "data" / "reference" / reference / "store"
    pt = next(p for p in Store(root).points() if not (p.parts["knobs"].get("chunked_prefill_size")
                                                      or p.parts["knobs"].get("max_running_requests")))
    facts = get_engine(engine).resolved_state(pt.resolved_config).facts
    assert facts["chunked_prefill_size"] == 8192
    f = _Frame(128, 100.0, defaults={"chunked_prefill_size": facts["chunked_prefill_size"]})
    state, why = f.refused("chunked_prefill_size=8192")
    assert state == "the default" and "already runs with chunked_prefill_size 8192" in why
    assert f.refused("chunked_prefill_size=2048") is None


def test_the_search_pairs_the_best_settings_of_its_two_best_knobs():
    from servescope.threads.verify import SearchRow, _pair

    cands = [("max_running_requests=8", Knobs(max_running_requests=8)),
             ("max_running_requests=16", Knobs(max_running_requests=16)),
             ("chunked_prefill_size=512", Knobs(chunked_prefill_size=512)),
             ("num_continuous_decode_steps=2", Knobs(num_continuous_decode_steps=2))]
    rows = [SearchRow("(combined)", "measured", vs_combined_pct=0.0, reference=True),
            SearchRow("max_running_requests=8", "measured", vs_combined_pct=4.0),
            SearchRow("max_running_requests=16", "measured", vs_combined_pct=9.0),
            SearchRow("chunked_prefill_size=512", "measured", vs_combined_pct=3.0),
            SearchRow("num_continuous_decode_steps=2", "measured", vs_combined_pct=-5.0)]
    ((setting, knobs),) = _pair(rows, cands)
    assert setting == "max_running_requests=16 + chunked_prefill_size=512"
    assert knobs == Knobs(max_running_requests=16, chunked_prefill_size=512)
    assert _pair(rows[:3], cands) == []  # one knob ahead: no pair


def test_a_setting_from_another_machine_start_is_shown_apart(tmp_path):
    """The reference ran in one machine start, the setting in another: its throughput is shown, never compared."""
    from types import SimpleNamespace

    import pandas as pd

    from servescope.threads.verify import _Frame

    pt = SimpleNamespace(machine_start="boot-b")
    st = SimpleNamespace(results=SimpleNamespace(summary=pd.DataFrame({"config": ["tune x=1"], "output_tok_s": [50.0]}),
                                                 stored={("tune x=1", 0): pt}))
    row = _Frame(8, 100.0, frozenset({"boot-a"})).row("x=1", st, "tune x=1", "--x 1")
    assert row.state == "other machine start" and row.output_tok_s == 50.0 and row.vs_combined_pct != row.vs_combined_pct
    assert row.status.startswith("shown apart: launched in another machine start")
    same = _Frame(8, 100.0, frozenset({"boot-b"})).row("x=1", st, "tune x=1", "--x 1")
    assert same.state == "measured" and same.vs_combined_pct == -50.0
