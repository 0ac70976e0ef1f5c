"""`make bench-stability` (not in CI: two cold runs of the default suite, about half an hour on 2 cores): does a second
run give each thread the same headline and tier?

Each run starts from an empty store. Per thread (every notebook that wrote findings, 00 aside): its headline (the
first finding's title, its numbers masked, and the change it recommends) and the summary tier of that finding; and
the front page's first line (verified or not, and the flags it names). Prints each thread's pair and both first
lines, then
`stability: threads=N same_headline=K same_tier=K same_first_line=yes|no` last. Goal (issues 20, 34): K = N, yes.

With --ray, the first run goes through the Ray runner on a local cluster of simulated nodes (Ray's own cluster
utilities: a head with no CPUs and two nodes of one CPU and one simulated GPU; one point at a time, so both runs
measure on the same quiet cores) and the second runs locally: the same comparison then says whether the suite gives
the same answers through Ray as locally (issue 61). With --locals 2 a third run goes locally too, and each thread
says whether its answer through Ray is one the two local runs gave (`ray_as_local: K of N`): where the local runs
disagree with each other, the host's noise decides the answer, not the runner.

Usage: python benchmarks/bench_stability.py [--suite data/suites/default.yaml] [--keep DIR] [--first REPORT_DIR]
       [--ray [--locals 2]]
"""

from __future__ import annotations

import argparse
import contextlib
import html
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "lib"))

from bench_report import run_cold  # noqa: E402
from common import local_cluster  # noqa: E402

from servescope.findings import Finding, read_findings  # noqa: E402
from servescope.summary import tier  # noqa: E402


def headlines(out_dir: Path) -> dict[str, tuple[str, str, str]]:
    """thread -> (headline title, recommended change, tier) of a rendered run."""
    out = {}
    for p in sorted(out_dir.glob("*.findings.json")):
        thread = p.name[: -len(".findings.json")]
        if thread.startswith("00_"):
            continue
        fs: list[Finding] = read_findings(p)
        if fs:
            f = fs[0]
            change = " ".join(f.recommended_flags) or f.recommendation
            # a number in a title is the measurement, not the verdict: "+127.0%" and "+74.4%" say the same
            out[thread] = (re.sub(r"[+-]?\d[\d,.]*%?", "#", f.title), change, tier(f))
    return out


def first_line(out_dir: Path) -> tuple[str, tuple[str, ...], str]:
    """The front page's first line: (Verified or Not verified, the flags it names and the scheduler setting verified
    on top, the whole line)."""
    m = re.search(r'id="verified" class="verified"><b>(.*?)</b>', (out_dir / "index.html").read_text(), re.S)
    raw = m.group(1) if m else ""
    line = html.unescape(re.sub(r"<[^>]+>", "", raw))
    # the flags it quotes: code spans (a page written before they were, backticks)
    quoted = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", raw, re.S)] + re.findall(r"`([^`]+)`", line)
    # the changes it names, in prose too (replicas have no flag: "by the changes (run 2 vllm servers ...; drop
    # --enforce-eager)"), numbers masked: a second run naming another change set is not the same line
    named = re.search(r"by the changes? \((.*)\), against", line)
    changes = re.sub(r"[+-]?\d[\d,.]*%?", "#", named.group(1)) if named else ""
    # the scheduler half: the setting verified ("... with --max-num-batched-tokens 512, against ..."), else none
    # (or the whole line's, where only the scheduler setting was verified: "Verified: ... with X, against ... (not
    # verified: ...)"); a verified change is spelled "with" too, so the words before it decide
    tuned = re.search(r"scheduler tuning on top: .*? with (--.*?), against", line) or \
        (re.match(r"Verified: .*? with (--.*?), against .* \(not verified", line) if " (not verified" in line else None)
    return line.split(":")[0], tuple(sorted(set(quoted))) + (
        changes, f"scheduler: {tuned.group(1) if tuned else 'none'}"), line


@contextlib.contextmanager
def on_ray(suite: Path, work: Path) -> Iterator[Path]:
    """A copy of suite whose points run through the Ray runner on a local cluster of simulated nodes, one at a time;
    the cluster is shut down when the block ends."""
    with local_cluster(2, gpus_per_node=1) as address:
        spec = yaml.safe_load(suite.read_text())
        spec["runner"] = {"kind": "ray", "address": address, "parallel": False}
        copy = work / f"ray-{suite.name}"
        copy.write_text(yaml.safe_dump(spec, sort_keys=False))
        yield copy


def _ray_as_local(runs: list[dict], lines: list[tuple], threads: list[str]) -> None:
    """Per thread, whether the Ray run's (the first) answer is one of the two local runs' answers, and whether
    those two agree."""
    as_local = 0
    for t in threads:
        ray, locals_ = runs[0].get(t), [runs[1].get(t), runs[2].get(t)]
        one = ray is not None and ray in locals_
        as_local += one
        print(f"{t}: ray {'as a local run' if one else 'UNLIKE both local runs'}; the local runs "
              f"{'agree' if locals_[0] == locals_[1] else 'differ'}: {ray} | {locals_[0]} | {locals_[1]}")
    line = "yes" if lines[0][:2] in (lines[1][:2], lines[2][:2]) else "no"
    print(f"ray_as_local: {as_local} of {len(threads)} threads, first_line={line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "data" / "suites" / "default.yaml"))
    ap.add_argument("--keep", help="keep both stores and reports in this folder")
    ap.add_argument("--first", help="the rendered report of an earlier cold run of the same suite (make bench-report "
                    "ARGS='--keep DIR' leaves it in DIR/reports-cold/cold): it stands as the first run, one more runs")
    ap.add_argument("--ray", action="store_true", help="the first run through the Ray runner on a local cluster of "
                    "simulated nodes, the second locally")
    ap.add_argument("--locals", type=int, default=1, choices=(1, 2), help="with --ray: local runs after it")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="servescope-bench-stability-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        runs, lines = [], []
        if a.first:
            runs.append(headlines(Path(a.first)))
            lines.append(first_line(Path(a.first)))
            print(f"run first: {a.first}\nrun first: first line: {lines[-1][2]}", flush=True)
        for tag in ("first", "second", "third")[len(runs):3 if a.ray and a.locals == 2 else 2]:
            with on_ray(Path(a.suite), work) if a.ray and tag == "first" else contextlib.nullcontext(
                    Path(a.suite)) as suite:
                done, wall, n = run_cold(suite, work, tag)
            tag += " (ray)" if a.ray and tag == "first" else ""
            print(f"run {tag}: wall_s={wall:.0f} launches={n['launches']} "
                  f"configurations_x_repetitions={n['configuration_repetitions']}", flush=True)
            runs.append(headlines(done.out_dir))
            lines.append(first_line(done.out_dir))
            print(f"run {tag}: first line: {lines[-1][2]}", flush=True)
        threads = sorted(set(runs[0]) | set(runs[1]))
        same_head = same_tier = 0
        for t in threads:
            a1, a2 = runs[0].get(t), runs[1].get(t)
            h = a1 is not None and a2 is not None and a1[:2] == a2[:2]
            ti = a1 is not None and a2 is not None and a1[2] == a2[2]
            same_head += h
            same_tier += ti
            print(f"{t}: {'same' if h and ti else 'DIFFERS'}: {a1} | {a2}")
        same_line = "yes" if lines[0][:2] == lines[1][:2] else "no"
        print(f"stability: threads={len(threads)} same_headline={same_head} same_tier={same_tier} "
              f"same_first_line={same_line}")
        if len(runs) == 3:
            _ray_as_local(runs, lines, threads)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
