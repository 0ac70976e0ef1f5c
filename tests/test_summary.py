"""The 99 summary's ranking (from the findings' data) and the front page, loaded in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from servescope import summary
from servescope.findings import Change, Conflict, Effect, Finding, Outcome, Verdict, write_findings
from servescope.report import NotebookRun, write_index
from servescope.suite import Suite

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _eff(pct: float, treatment: str = "b") -> Effect:
    return Effect(metric="output_tok_s", value_pct=pct, n=3, at="c=16", baseline="a", treatment=treatment)


FINDINGS = {
    "02_piecewise_cuda_graphs": [Finding(kind="effect", thread="02", title="Use CUDA graphs: full", headline="full +46%.",
                                        effect=_eff(45.9), change=Change(flags=["--cb-use-cuda-graph"]),
                                        confidence="medium")],
    "05_torch_compile": [Finding(kind="effect", thread="05", title="compile", headline="compile +80%.", effect=_eff(80.0),
                                 change=Change(flags=["-O3"]), confidence="high"),
                         Finding(kind="effect", thread="05", title="compile: no flag", headline="x.", effect=_eff(5.0),
                                 confidence="low", optimal=True,
                                 reason="already optimal: the engine's defaults are the better side")],
    "03_clocks_power": [Finding(kind="regime", thread="03", title="Not throttled: most load levels launch-bound (5 of 6)",
                                headline="x",
                                applies=False, reason="no point was throttled", confidence="high"),
                        Finding(kind="effect", thread="03", title="defaults at c=16: launch-bound", headline="launch-bound.",
                                change=Change(flags=["--cb-use-cuda-graph"]), confidence="high")],
    "06_grouped_gemm": [Finding(kind="effect", thread="06", title="MoE runs per expert", headline="loop.", confidence="medium",
                                change=Change(words='set "experts_implementation": "grouped_mm"'))],
    "04_data_parallelism": [Finding(kind="effect", thread="04", title="Layouts: not compared", headline="none.", applies=False,
                                    reason="no data")],
    "01_cuda_graph_disable_reason": [Finding(kind="effect", thread="01", title="Why CUDA graphs are off", headline="flag.",
                                             confidence="high")],
}


def test_ranking_comes_from_the_findings_data():
    r = summary.rank(FINDINGS)
    tiers = dict(zip(r["finding"], r["tier"], strict=True))
    assert tiers == {"compile": "High", "Use CUDA graphs: full": "Medium", "defaults at c=16: launch-bound": "Low",
                     "MoE runs per expert": "Low", "compile: no flag": "Already optimal",
                     "Why CUDA graphs are off": "Measured, no change",
                     "Not throttled: most load levels launch-bound (5 of 6)": "Not applicable here",
                     "Layouts: not compared": "Not measured"}
    assert r["finding"].tolist()[:2] == ["compile", "Use CUDA graphs: full"]  # tier first, then effect
    low = r[r["tier"] == "Low"]
    assert (low["effect"] == "not measured: suggested by the readings").all()
    assert r.loc[r["finding"] == "MoE runs per expert", "change"].item() == 'set "experts_implementation": "grouped_mm"'
    assert r.loc[r["finding"] == "compile", "evidence"].item() == "05_torch_compile.html#Answer"
    assert summary.regime(FINDINGS).startswith("Not throttled: most load levels launch-bound")
    (head,) = summary.findings(r, FINDINGS)
    assert head.title == "First change: compile" and head.confidence == "high" and "3 change(s)" in head.claim


def test_nothing_to_rank_is_said_so():
    empty = {"05_torch_compile": [Finding(kind="effect", thread="05", title="not measured", headline="x", applies=False)]}
    (head,) = summary.findings(summary.rank(empty), empty)
    assert head.title == "Nothing measured to rank" and not head.answers


def _front_page(tmp_path: Path) -> Path:
    runs = []
    for nb, fs in FINDINGS.items():
        (tmp_path / f"{nb}.html").write_text(f"<html><body><h2 id='Answer'>Answer</h2>{nb}</body></html>")
        write_findings(fs, tmp_path / f"{nb}.findings.json")
        runs.append(NotebookRun(id=nb, status="ok", html=f"{nb}.html", findings=fs,
                                outcome=Outcome(thread=nb, points_planned=2, points_measured=2, findings_total=1,
                                                findings_answering=1)))
    suite = Suite(name="t", notebooks=[{"id": n} for n in FINDINGS])
    write_index(tmp_path, suite, tmp_path / "suite.yaml", "run-1", 0.0, runs)
    return tmp_path / "index.html"


def test_front_page_in_headless_chromium_answers_first_with_working_links(tmp_path):
    assert CHROMIUM is not None, "Debian's chromium is not installed: `make browser` (part of make test) installs it"
    index = _front_page(tmp_path)
    run = lambda *a: subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *a,  # noqa: E731
                                     f"file://{index}"], capture_output=True, text=True, timeout=120)
    dom = run("--dump-dom").stdout
    answer, notebooks = dom.index('id="answer"'), dom.index('id="notebooks"')
    assert answer < notebooks  # the answer comes before the list of notebooks
    table = dom[dom.index('id="summary"'):dom.index("</table>", dom.index('id="summary"'))]
    rows = re.findall(r"<tr><td>(\d+)</td><td><b>([^<]+)</b>", table)
    # the regime's suggestion names the same flags as thread 02's measured change: listed once, measured first
    assert [name for _, name in rows] == ["compile", "Use CUDA graphs: full", "MoE runs per expert"]
    links = re.findall(r'href="([^"]+)"', table)
    assert links and all((tmp_path / h.split("#")[0]).is_file() for h in links)
    assert "Regime under load:</b> Not throttled" in dom
    shot = tmp_path / "front.png"
    run(f"--screenshot={shot}", "--window-size=1200,1000")
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty canvas


def test_already_optimal_names_the_setting_and_what_it_beat():
    lost = Finding(kind="effect", thread="04", title="2 replicas, round-robin vs 1 server", headline="x.", direction="worse",
                   effect=Effect(metric="output_tok_s", value_pct=-46.0, ci_low_pct=-50.0, ci_high_pct=-40.0, n=3,
                                 at="c=1", baseline="1 server", treatment="2 replicas, round-robin"),
                   confidence="medium", reason="already optimal: the engine's defaults are the better side", optimal=True)
    won = Finding(kind="effect", thread="05", title="torch.compile: compiled vs eager", headline="x.", direction="better",
                  effect=Effect(metric="output_tok_s", value_pct=71.0, n=3, baseline="eager", treatment="compiled"),
                  confidence="high", reason="already optimal: the engine's defaults are the better side", optimal=True)
    assert summary.optimal_words(lost) == ("1 server (it beat 2 replicas, round-robin: -46.0% output_tok_s "
                                           "(90% CI -50.0..-40.0%, n=3, at c=1))")
    assert summary.optimal_words(won).startswith("compiled (it beat eager: +71.0% output_tok_s")
    r = summary.rank({"04_data_parallelism": [lost]})
    assert r["optimal"].tolist() == [summary.optimal_words(lost)]


def test_the_front_pages_first_line_is_the_verified_answer(tmp_path):
    line = "Verified: +233.7% output_tok_s (90% CI +229.9..+237.4%, n=3, mean over c=2, 8) with --itl-ms 1"
    checked = [Finding(kind="verification", thread="07_verified_changes",
                       title="Verified: the recommended changes together", headline="x", confidence="high",
                       verdict=Verdict(verified=True, words=line.removeprefix("Verified: ")))]
    (tmp_path / "changes").mkdir()
    (tmp_path / "changes" / "01-itl-ms-1.md").write_text("# Change 1")
    runs = [NotebookRun(id="07_verified_changes", html="07_verified_changes.html", findings=checked)]
    suite = Suite(name="t", notebooks=[{"id": "07_verified_changes"}])
    write_index(tmp_path, suite, tmp_path / "suite.yaml", "run-1", 0.0, runs)
    page = (tmp_path / "index.html").read_text()
    answer = page[page.index('id="answer"'):]
    assert answer.index(line) < answer.index("Regime under load")  # the first line of the answer
    assert 'href="changes/01-itl-ms-1.md"' in page and 'href="07_verified_changes.html#Answer"' in page
    write_index(tmp_path, suite, tmp_path / "suite.yaml", "run-2", 0.0, [])
    assert "Not verified: this run did not measure the recommended changes together" in \
        (tmp_path / "index.html").read_text()


def test_the_tier_is_the_findings_data_never_its_words():
    """'Already optimal' comes from the finding's optimal field: a reworded reason or title changes no tier (the
    tier had been read from reason.startswith('already optimal') and title.startswith('Keep '))."""
    from servescope.findings import tier

    kept = Finding(kind="effect", thread="04", title="One server stays best", headline="x.", confidence="medium", optimal=True)
    said = Finding(kind="effect", thread="04", title="Keep 1 server: every other layout measured served less", headline="x.",
                   confidence="medium", reason="already optimal: the engine's defaults are the better side")
    assert tier(kept) == "Already optimal" and tier(said) == "Measured, no change"


def test_the_first_line_is_rendered_from_07s_verdicts_alone():
    """The front page's first line comes from thread 07's typed verdicts: the combined changes', then the search's;
    the findings' titles and sentences play no part (they are set to nonsense here)."""
    def f(verified: bool | None, words: str = "") -> Finding:
        return Finding(kind="verification", thread="07_verified_changes", title="zz", headline="zz",
                       verdict=Verdict(verified=verified, words=words) if verified is not None else None)

    assert summary.front_line([f(True, "+10% by X"), f(None)]) == "Verified: +10% by X"
    assert summary.front_line([f(False, "no change to verify"), f(False, "none of the 2 tried beat it")]) == \
        "Not verified: no change to verify; no scheduler setting was verified: none of the 2 tried beat it"
    assert summary.front_line([f(True, "+10% by X"), f(True, "+5% with Y")]) == \
        "Verified: +10% by X; scheduler tuning on top: +5% with Y"
    assert summary.front_line([f(False, "no change to verify"), f(True, "+5% with Y")]) == \
        "Verified: +5% with Y (not verified: no change to verify)"


def _reworded(by_thread: dict[str, list[Finding]]) -> dict[str, list[Finding]]:
    """Every finding with its words replaced (title, headline, detail, reason), its fields kept."""
    return {t: [f.model_copy(update={"title": f"reworded {i}", "headline": "Reworded", "detail": "Also reworded.",
                                     "reason": "reworded" if f.reason else ""}) for i, f in enumerate(fs)]
            for t, fs in by_thread.items()}


def _decisions(by_thread: dict[str, list[Finding]]) -> tuple:
    """What 07 verifies (the combined knobs, which changes joined) and what 99 ranks (tier, thread, order, change)."""
    from servescope.spec import Knobs
    from servescope.threads import verify

    combined, found = verify.compose(Knobs(), verify.changes(by_thread), verify.exclusion_rules(by_thread))
    r = summary.rank(by_thread)
    return (combined, [(c.thread, c.knobs, bool(c.excluded)) for c in found],
            r[["tier", "thread", "change", "effect"]].to_dict("records"), summary.recommendations(r)["change"].tolist())


@pytest.mark.parametrize("reference", ["sglang-h200", "h200"])
def test_rewording_every_finding_changes_nothing_07_verifies_or_99_ranks(reference):
    """Done-when of issue 31, on the findings recorded on the H200: thread 05's title and cautions (and every other
    finding's words) reworded, the combined configuration, which changes join it, the tiers and the order stay."""
    from servescope.findings import collect

    by_thread = collect(Path(__file__).resolve().parents[1] / "data" / "reference" / reference / "report")
    got = _decisions(by_thread)
    assert by_thread.get("05_torch_compile") and got[3], "a reference with 05's findings and changes to rank"
    assert got[1] or reference == "h200", "SGLang's: changes for 07 to compose"
    assert _decisions(_reworded(by_thread)) == _decisions(by_thread)


def test_rewording_thread_05s_rule_changes_nothing_07_leaves_out():
    """The exclusion rule travels as data (05's change excludes piecewise graphs): reworded, 07 still leaves
    piecewise graphs out of a combination with compile."""
    from servescope.spec import Knobs

    eff = Effect(metric="output_tok_s", value_pct=40.0, n=3)
    by_thread = {
        "05_torch_compile": [
            Finding(kind="effect", thread="05", title="torch.compile", headline="helps", effect=eff, confidence="high",
                    direction="better", change=Change(knobs=Knobs(torch_compile=True), flags=["--compile"])),
            Finding(kind="rule", thread="05", title="torch.compile excludes piecewise CUDA graphs here",
                    headline="with compile on, piecewise resolved to off", confidence="high",
                    change=Change(knobs=Knobs(torch_compile=True),
                                  excludes=[Conflict(knobs={"cuda_graph": "piecewise"}, why="the rule")]))],
        "02_piecewise_cuda_graphs": [
            Finding(kind="effect", thread="02", title="Use CUDA graphs: piecewise", headline="helps", effect=eff,
                    confidence="medium", direction="better",
                    change=Change(knobs=Knobs(cuda_graph="piecewise"), flags=["--piecewise"]))]}
    got = _decisions(by_thread)
    assert got[0] == Knobs(torch_compile=True) and [x[2] for x in got[1]] == [False, True]
    assert _decisions(_reworded(by_thread)) == got


def test_a_notebook_pages_tables_read_from_the_left_in_headless_chromium(tmp_path):
    """JupyterLab's stylesheet right-aligns every output table cell: the ranked table's flags and sentences read as
    ragged columns (seen on the vLLM H200 summary). The page's own stylesheet must win in a real browser; the ranked
    table links each thread to its answer instead of a column of links that ran off the page."""
    import nbformat

    from servescope import nb as nbmod
    from servescope.report import render_html

    assert CHROMIUM is not None, "Debian's chromium is not installed: `make browser` (part of make test) installs it"
    ranked = summary.rank(FINDINGS)
    table = nbmod.ranked_table(ranked)
    assert "evidence" not in table.data and '<a href="05_torch_compile.html#Answer">05_torch_compile</a>' in table.data
    quoted = ranked.head(1).assign(change="run 2 servers, each with `--mem 0.45` <pinned>")
    assert "run 2 servers, each with <code>--mem 0.45</code> &lt;pinned&gt;" in nbmod.ranked_table(quoted).data
    note = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("nb.ranked_table(ranked)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": table.data})]
    note.cells = [cell]
    nbformat.write(note, str(tmp_path / "x.ipynb"))
    render_html(tmp_path / "x.ipynb", tmp_path / "x.html", hide_code=True)
    page = (tmp_path / "x.html").read_text()
    probe = ("<script>window.addEventListener('load', () => { const td = document.querySelector("
             "'table.servescope-ranked td'); document.body.dataset.align = getComputedStyle(td).textAlign; });"
             "</script>")
    (tmp_path / "x.html").write_text(page.replace("</body>", probe + "</body>"))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          f"file://{tmp_path / 'x.html'}"], capture_output=True, text=True, timeout=120).stdout
    assert re.search(r'<body[^>]*data-align="left"', dom), re.search(r"<body[^>]*>", dom)


def test_a_change_found_by_several_threads_is_listed_once_with_each_of_them():
    """The sglang-qwen3-30b findings: 01 (why graphs are off), 02 (the mode to use) and 07 (verified) all name the
    same flags; the recommendations list them once, found by every thread that did."""
    from servescope.findings import read_findings

    rep = Path(__file__).resolve().parents[1] / "data" / "reference" / "sglang-qwen3-30b" / "report"
    by_thread = {p.name.split(".")[0]: read_findings(p) for p in sorted(rep.glob("*.findings.json"))
                 if not p.name.startswith("99_")}
    recs = summary.recommendations(summary.rank(by_thread), 99)
    assert recs["change"].is_unique
    top = recs.iloc[0]
    assert "--cuda-graph-backend-prefill breakable" in top["change"]
    assert len(top["found_by"].split(", ")) >= 2 and top["thread"] in top["found_by"]


def test_the_ranking_lists_each_change_once_with_every_thread_that_found_it():
    """vllm-qwen3-30b: 02's answer, 02's per-mode finding and 07's verification all name one fix (drop
    --enforce-eager for piecewise graphs with compile): one row, found by 02 and 07."""
    from pathlib import Path

    from servescope import summary
    from servescope.findings import read_findings

    d = Path(__file__).resolve().parents[1] / "data" / "reference" / "vllm-qwen3-30b" / "report"
    by = {p.name.split(".")[0]: read_findings(p) for p in sorted(d.glob("*.findings.json"))
          if not p.name.startswith("99")}
    ranked = summary.rank(by)
    assert (ranked["tier"] == "High").sum() == 3
    once = summary.each_change_once(ranked)
    high = once[once["tier"] == "High"]
    assert len(high) == 1 and high["found_by"].iloc[0] == "02_piecewise_cuda_graphs, 07_verified_changes"
    assert len(once) == len(ranked) - 2



def test_committed_pages_fit_a_1280_px_window_or_scroll_inside_their_cell(tmp_path):
    """The pages that once cut tables off at 1280 px (issue 59: 02, 03) and the widest of today's, through the same
    probe benchmarks/page_widths.py runs over every committed reference: nothing runs past the window's right edge
    outside a box that scrolls sideways; a table 80 columns wide does."""
    import importlib.util

    assert CHROMIUM is not None, "Debian's chromium is not installed: `make browser` (part of make test) installs it"
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("page_widths", root / "benchmarks" / "page_widths.py")
    pw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pw)
    ref = root / "data" / "reference"
    for page in (ref / "sglang-h200" / "report" / "02_piecewise_cuda_graphs.html",
                 ref / "sglang-h200" / "report" / "03_clocks_power.html",
                 ref / "vllm-h200" / "report" / "07_verified_changes.html",
                 ref / "sglang-qwen3-30b-h100" / "report" / "index.html"):
        assert pw.cut_elements(page, CHROMIUM)["cut"] == [], page
    row = "".join(f"<td>column_{i}_value</td>" for i in range(80))
    wide = tmp_path / "wide.html"
    wide.write_text(f"<html><body><table><tr>{row}</tr></table>"
                    f'<div style="overflow-x:auto"><table><tr>{row}</tr></table></div></body></html>')
    assert [el["tag"] for el in pw.cut_elements(wide, CHROMIUM)["cut"]] == ["table"]
