"""The one GPU entry point (benchmarks/gpu/pack.py here, benchmarks/gpu/on_gpu.py on the GPU machine): parts that fit
beside the tree, gathered across calls and checked, and a fresh machine said plainly. Its real runs are the H200
recordings of data/reference/sglang-h200 (gpu-logs/ keeps what each call printed)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parts_fit_their_budget_largest_first(tmp_path):
    pack = _load("pack")
    files = []
    for name, size in (("a.whl", 30), ("b.whl", 20), ("c.whl", 15), ("d.whl", 10)):
        (tmp_path / name).write_bytes(b"x" * size)
        files.append(("suite", tmp_path / name))
    parts = pack.split(files, 40)
    assert [[f.name for _, f in p] for p in parts] == [["a.whl", "d.whl"], ["b.whl", "c.whl"]]
    with pytest.raises(SystemExit, match="more than one call carries"):
        pack.split(files, 25)


def test_the_sglang_suite_needs_its_engine_wheels():
    pack = _load("pack")
    assert pack.needs(ROOT / "data" / "suites" / "sglang-h200.yaml") == ["suite", "nsys", "sglang"]
    assert pack.needs(ROOT / "data" / "suites" / "transformers-gpu.yaml") == ["suite", "nsys"]


def test_a_fresh_machine_is_said_plainly_and_parts_are_checked(tmp_path, monkeypatch):
    gpu = _load("on_gpu")
    monkeypatch.setattr(gpu, "WORK", tmp_path / "work")
    monkeypatch.setattr(gpu, "ROOT", tmp_path / "repo")
    with pytest.raises(SystemExit, match=r"the machine changed: part\(s\) 01, 02 sent by earlier calls are not here"):
        gpu.check_machine([1, 2])
    part = tmp_path / "repo" / ".device" / "parts" / "01"
    part.mkdir(parents=True)
    (part / "w.whl").write_bytes(b"wheel")
    manifest = {"parts": 2, "files": [
        {"name": "w.whl", "kinds": ["suite"], "part": 1, "bytes": 5, "sha256": hashlib.sha256(b"wheel").hexdigest()},
        {"name": "v.whl", "kinds": ["suite", "sglang"], "part": 2, "bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}]}
    gpu.check_machine([])
    assert gpu.gather(manifest) == ([1], [2])
    (tmp_path / "work" / "received").write_text("1")
    gpu.check_machine([1])  # the first call's part is still here: no complaint
    (part / "w.whl").write_bytes(b"changed")
    with pytest.raises(SystemExit, match="sha256 differs from parts.json"):
        gpu.gather(manifest)


def test_the_committed_manifest_names_every_part_once():
    m = json.loads((ROOT / "benchmarks" / "gpu" / "parts.json").read_text())
    assert {f["part"] for f in m["files"]} == set(range(1, m["parts"] + 1))
    assert len({f["name"] for f in m["files"]}) == len(m["files"])


def test_compact_store_rounds_gaps_and_keeps_everything_else(tmp_path):
    """The recorded stores travel in every device call: their request tables are rewritten with gaps at 0.1 us and
    zstd, and nothing else in them changes."""
    import pandas as pd

    compact = _load("compact_store")
    point = tmp_path / "abc"
    point.mkdir()
    df = pd.DataFrame({"request_id": [0, 1], "ttft_ms": [12.3456789, 7.0], "itl_ms": [[0.123456789, 1.0], []]})
    df.to_parquet(point / "requests.parquet", index=False)
    (point / "manifest.json").write_text("{}")
    compact.compact(tmp_path)
    back = pd.read_parquet(point / "requests.parquet")
    assert list(back["itl_ms"][0]) == [0.1235, 1.0] and list(back["itl_ms"][1]) == []
    assert back["ttft_ms"].tolist() == [12.3456789, 7.0]  # only the gaps are rounded
    assert (point / "manifest.json").read_text() == "{}"


def test_each_suite_continues_its_own_store(tmp_path, monkeypatch):
    """A second suite recorded on the same warm machine (the cold second recording after the first's search) starts
    from its own store, never from the store the first left there."""
    gpu = _load("on_gpu")
    monkeypatch.setattr(gpu, "WORK", tmp_path / "work")
    monkeypatch.setattr(gpu, "ROOT", tmp_path / "repo")
    ref = tmp_path / "repo" / "data" / "reference" / "first" / "store" / "p1"
    ref.mkdir(parents=True)
    (ref / "manifest.json").write_text("{}")
    first = gpu.suite_store("first")
    assert (first / "p1" / "manifest.json").is_file()
    (first / "p2").mkdir()  # a point the first suite measured on this machine
    second = gpu.suite_store("second")
    assert second != first and list(second.iterdir()) == []
    assert (gpu.suite_store("first") / "p2").is_dir()  # the first continues where it was


def test_rerender_keeps_00s_html_and_json_but_never_its_executed_notebook(tmp_path):
    """The GPU machine's reports.tgz holds 00's executed notebook beside its HTML and findings: a reference report
    commits no notebook with outputs."""
    import tarfile

    rerender = _load("rerender")
    run = tmp_path / "reports" / "gpu-1"
    run.mkdir(parents=True)
    for name in ("00_environment.findings.json", "00_environment.html", "00_environment.ipynb"):
        (run / name).write_text("{}")
    with tarfile.open(tmp_path / "reports.tgz", "w:gz") as tf:
        tf.add(tmp_path / "reports", arcname="reports")
    report = tmp_path / "report"
    report.mkdir()
    rerender.take_kept(tmp_path / "reports.tgz", report)
    assert sorted(p.name for p in report.iterdir()) == ["00_environment.findings.json", "00_environment.html"]


def test_a_file_larger_than_a_call_travels_in_pieces_and_is_joined_whole(tmp_path, monkeypatch):
    """The slim vLLM wheel's transport pieces (35 MiB) are larger than what a call carries beside a 50 MiB tree: pack
    cuts them, each piece travels in its own part, and on_gpu joins them once all are here, checking the whole."""
    pack, gpu = _load("pack"), _load("on_gpu")
    big = tmp_path / "v.whl.xz.part-00"
    big.write_bytes(bytes(range(256)) * 10)  # 2,560 bytes against a budget of 1,000
    (tmp_path / "s.whl").write_bytes(b"s")
    files, of = pack.cut([("vllm", big), ("suite", tmp_path / "s.whl")], 1000, tmp_path / "pieces")
    assert [f.name for _, f in files] == ["v.whl.xz.part-00.piece-00", "v.whl.xz.part-00.piece-01",
                                          "v.whl.xz.part-00.piece-02", "s.whl"]
    parts = pack.split(files, 1000)
    manifest = {"parts": len(parts), "files": [
        {"name": f.name, "kinds": [k], "part": n, "bytes": f.stat().st_size, "sha256": pack.sha256(f)}
        | ({"of": of[f.name]} if f.name in of else {}) for n, part in enumerate(parts, 1) for k, f in part]}
    monkeypatch.setattr(gpu, "WORK", tmp_path / "work")
    monkeypatch.setattr(gpu, "ROOT", tmp_path / "repo")
    sent = []
    for n, part in enumerate(parts, 1):  # one call per part, back to back
        d = tmp_path / "repo" / ".device" / "parts" / f"{n:02d}"
        if d.parent.exists():
            for old in d.parent.iterdir():
                for f in old.iterdir():
                    f.unlink()
                old.rmdir()
        d.mkdir(parents=True)
        for _, f in part:
            (d / f.name).write_bytes(f.read_bytes())
        have, missing = gpu.gather(manifest)
        sent.append(n)
    assert (have, missing) == (sent, [])
    joined = tmp_path / "work" / "files" / "v.whl.xz.part-00"
    assert joined.read_bytes() == big.read_bytes() and not list(joined.parent.glob("*.piece-*"))
    assert gpu.gather(manifest) == (sent, [])  # joined once: a later call still counts every part as here
    files_by_kind = {}
    for f in manifest["files"]:
        files_by_kind.setdefault(f["kinds"][0], set()).add(f["of"]["name"] if "of" in f else f["name"])
    assert files_by_kind == {"vllm": {"v.whl.xz.part-00"}, "suite": {"s.whl"}}


def test_the_vllm_suite_needs_its_engine_set():
    assert _load("pack").needs(ROOT / "data" / "suites" / "vllm-h200.yaml") == ["suite", "nsys", "vllm"]


def test_a_file_that_goes_while_the_store_is_saved_is_left_out_not_fatal(tmp_path, monkeypatch):
    """The H200 call of 2026-12-04 died in save(): a point moved out of _partial between the listing and the read,
    the driver raised, and the suite went on alone. A file that goes is left out of that copy; the rest is saved."""
    import os
    import tarfile

    gpu = _load("on_gpu")
    monkeypatch.setattr(gpu, "OUT", tmp_path / "out")
    src = tmp_path / "store"
    (src / "_partial" / "p1" / "levels").mkdir(parents=True)
    (src / "_partial" / "p1" / "levels" / "telemetry_gpu.parquet").write_bytes(b"x")
    (src / "p0").mkdir()
    (src / "p0" / "manifest.json").write_text("{}")
    real = tarfile.TarFile.gettarinfo

    def racing(self, name=None, arcname=None, fileobj=None):
        if str(name).endswith("telemetry_gpu.parquet"):
            os.remove(name)  # the store completes the point now
        return real(self, name, arcname, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", racing)
    gpu.save(src, "store.tgz")
    with tarfile.open(tmp_path / "out" / "store.tgz") as tf:
        names = tf.getnames()
    assert "store/p0/manifest.json" in names and "store/_partial/p1/levels" in names
    assert not any(n.endswith("telemetry_gpu.parquet") for n in names)


def test_a_driver_that_fails_stops_its_suite_first(tmp_path, monkeypatch):
    """Whatever ends the driver while the suite runs, the suite's process group is stopped before it returns."""
    import subprocess
    import sys

    gpu = _load("on_gpu")
    monkeypatch.setattr(gpu, "OUT", tmp_path / "out")
    monkeypatch.setattr(gpu, "WORK", tmp_path / "work")
    monkeypatch.setattr(gpu, "ROOT", tmp_path)
    (tmp_path / "out").mkdir()
    pid_file = tmp_path / "pid"
    monkeypatch.setattr(gpu, "suite_command", lambda *a: [
        sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"])

    def failing_save(src, name, exclude_logs_over=0):
        for _ in range(100):  # the suite is up (its pid written) before the driver fails
            if pid_file.is_file() and pid_file.read_text():
                break
            subprocess.run(["sleep", "0.1"])
        raise RuntimeError("driver bug")

    monkeypatch.setattr(gpu, "save", failing_save)
    monkeypatch.setattr(gpu.time, "sleep", lambda s: subprocess.run(["sleep", "0.2"]))
    with pytest.raises(RuntimeError, match="driver bug"):
        gpu.run_suite("suite.yaml", "s", {}, 540, [])
    pid = int(pid_file.read_text())
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0


def test_slimming_the_index_hides_what_the_gpu_never_reads_and_restore_puts_it_back(tmp_path):
    """The device tool carries what git sees; slim_index.py takes the rendered references, the other suites' stores
    and the fixtures out of git's index (the files stay on disk) and hides them, keeping the suite's own store and the
    code; restore leaves the index and .git/info/exclude as they were (the third vLLM session did this by hand: a
    commit made while slimmed would have deleted the references)."""
    import subprocess

    slim = _load("slim_index")
    files = ["lib/a.py", "data/engines/matrix.csv", "data/reference/README.md", "data/reference/v/store/k1/m.json",
             "data/reference/v/report/index.html", "data/reference/v/gpu-logs/call1.run.log",
             "data/reference/other/store/k2/m.json", "data/reference/store/k3/m.json", "tests/fixtures/x/y.json"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f)
    (tmp_path / "suite.yaml").write_text("name: v\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    exclude = tmp_path / ".git" / "info" / "exclude"
    exclude.write_text("own-pattern\n")
    seen = sorted(git("ls-files", "--cached", "--others", "--exclude-standard").split())
    assert slim.slim(tmp_path, tmp_path / "suite.yaml") == [
        "data/reference/other", "data/reference/store", "data/reference/v/gpu-logs", "data/reference/v/report",
        "tests/fixtures"]
    carried = sorted(git("ls-files", "--cached", "--others", "--exclude-standard").split())
    assert carried == ["data/engines/matrix.csv", "data/reference/README.md", "data/reference/v/store/k1/m.json",
                       "lib/a.py", "suite.yaml"]
    assert all((tmp_path / f).is_file() for f in files)  # on disk still
    with pytest.raises(SystemExit, match="slimmed already"):
        slim.slim(tmp_path, tmp_path / "suite.yaml")
    assert len(slim.restore(tmp_path)) == 5
    assert sorted(git("ls-files", "--cached", "--others", "--exclude-standard").split()) == seen
    assert git("status", "--porcelain") == "" and exclude.read_text() == "own-pattern\n"
    assert slim.restore(tmp_path) == []  # nothing slimmed: nothing to do


def test_slimming_keeps_the_stores_a_suite_compares_against(tmp_path):
    """A suite's compare_with stores travel to the GPU machine (99 reads them there); their reports and logs do not; a
    compare_with outside data/reference/<name>/store is refused before anything is taken out of the index."""
    import subprocess

    slim = _load("slim_index")
    files = ["lib/a.py", "data/reference/v/store/k1/m.json", "data/reference/v/report/index.html",
             "data/reference/s/store/k2/m.json", "data/reference/s/report/index.html",
             "data/reference/other/store/k3/m.json"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f)
    (tmp_path / "data" / "suites").mkdir(parents=True)
    suite = tmp_path / "data" / "suites" / "v.yaml"
    suite.write_text("name: v\ncompare_with: [../reference/s/store]\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    assert slim.slim(tmp_path, suite) == ["data/reference/other", "data/reference/s/report", "data/reference/v/report"]
    slim.restore(tmp_path)
    suite.write_text("name: v\ncompare_with: [../../elsewhere/store]\n")
    with pytest.raises(SystemExit, match="not a data/reference/<name>/store"):
        slim.slim(tmp_path, suite)
    assert not slim.slimmed(tmp_path)


def test_pack_refuses_when_the_tree_leaves_no_room_for_parts(monkeypatch):
    """A tree over what a call carries left pack.py printing '0 parts of at most -5.0 MiB' (seen at 65 MiB): it
    refuses, and says how to slim."""
    import sys

    pack = _load("pack")
    monkeypatch.setattr(pack, "needs", lambda suite: [])
    monkeypatch.setattr(pack, "tree_bytes", lambda: 65 * 2**20)
    monkeypatch.setattr(sys, "argv", ["pack.py", "data/suites/vllm-h200.yaml"])
    with pytest.raises(SystemExit, match="no room for parts; benchmarks/gpu/slim_index.py slim"):
        pack.main()


def test_the_suite_gets_the_calls_budget_less_its_margin():
    """The suite launches nothing past the call's budget (less the time its start and report take): the SIGTERM at
    BUDGET_S cut one launch per call short in the vLLM H200 sessions, ready a second before it came."""
    from pathlib import Path

    gpu = _load("on_gpu")
    cmd = gpu.suite_command("s.yaml", Path("/st"), Path("/r"), ["--only", "07"], 540)
    i = cmd.index("--budget-s")
    assert float(cmd[i + 1]) == 540 - gpu.SUITE_MARGIN_S and cmd[-2:] == ["--only", "07"]


def test_budget_s_counts_from_the_calls_start_the_install_comes_out_of_it(tmp_path, monkeypatch):
    """BUDGET_S is the call's: the suite gets what the parts and the install left of it. A second vLLM recording's
    first call (install 41 s) gave the suite all of BUDGET_S, so the call's time limit killed a launch mid-way."""
    gpu = _load("on_gpu")
    clock = {"now": 1000.0}
    got = {}
    monkeypatch.setattr(gpu, "OUT", tmp_path / "out")
    monkeypatch.setattr(gpu, "WORK", tmp_path / "work")
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(gpu.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(gpu.time, "sleep", lambda s: None)
    monkeypatch.setattr(gpu, "check_machine", lambda sent: None)
    monkeypatch.setattr(gpu, "gather", lambda manifest: ([1, 2], []))

    def install(manifest, suite):
        clock["now"] += 41.0  # joining, unpacking and installing the wheels
        return {}

    monkeypatch.setattr(gpu, "install", install)
    monkeypatch.setattr(gpu.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(gpu.signal, "signal", lambda *a: None)
    monkeypatch.setattr(gpu, "leftovers", lambda: [])
    monkeypatch.setattr(gpu, "suite_store", lambda name: tmp_path / "store")
    monkeypatch.setattr(gpu, "check_store_card", lambda store, env: None)
    monkeypatch.setattr(gpu, "run_suite", lambda path, name, env, budget_s, only: got.update(budget_s=budget_s) or 0)
    monkeypatch.setenv("BUDGET_S", "470")
    monkeypatch.setenv("SENT", "01")
    monkeypatch.setattr(gpu.sys, "argv", ["on_gpu.py", "data/suites/vllm-h200-second.yaml"])
    assert gpu.main() == 0
    assert got["budget_s"] == 470 - 41


def _fake_smi(tmp_path: Path, monkeypatch, name: str) -> None:
    """nvidia-smi on PATH that names one GPU."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    smi = bin_ / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{name}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{__import__('os').environ['PATH']}")


def test_a_call_that_lands_on_another_card_stops_before_it_stores_anything(tmp_path, monkeypatch):
    """A call without a kind may get an H100 while the recording it continues is the H200's: GPU_NAME stops it at
    once, and the store check stops it after the install even without GPU_NAME (the store's keys do not hold the card,
    so an H100's repetitions would be read beside the H200's)."""
    import os

    gpu = _load("on_gpu")
    _fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3")
    with pytest.raises(SystemExit, match="this machine's GPU is NVIDIA H100 80GB HBM3, not the NVIDIA H200 the call"):
        gpu.check_card("NVIDIA H200")
    gpu.check_card("H100")
    gpu.check_card("")  # not asked: no check
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    store = ROOT / "data" / "reference" / "vllm-h200" / "store"
    with pytest.raises(SystemExit, match="measured on NVIDIA H200; this machine has NVIDIA H100 80GB HBM3: not "
                                         "continued"):
        gpu.check_store_card(store, env)
    _fake_smi(tmp_path, monkeypatch, "NVIDIA H200")
    gpu.check_store_card(store, env)  # the same card: continued
    (tmp_path / "empty").mkdir()
    gpu.check_store_card(tmp_path / "empty", env)  # a cold recording: nothing to match


def test_pack_names_the_card_of_the_store_a_recording_continues():
    pack = _load("pack")
    assert pack.reference_card(ROOT / "data" / "suites" / "vllm-h200-second.yaml") == "NVIDIA H200"
    assert pack.reference_card(ROOT / "data" / "suites" / "sglang-h200x2.yaml") == ""  # not recorded yet


def test_a_store_larger_than_a_file_may_come_back_in_is_saved_in_pieces_that_join_whole(tmp_path, monkeypatch):
    """The device brings back no file over 16 MiB: SGLang's H100 store with 06's nsys tables reached 26 MB and its
    store.tgz was left out. The archive comes in numbered pieces under the limit, a smaller one whole, and a save
    after a larger one leaves no stale piece."""
    import os
    import subprocess

    gpu = _load("on_gpu")
    monkeypatch.setattr(gpu, "OUT", tmp_path / "out")
    monkeypatch.setattr(gpu, "PIECE_BYTES", 4096)
    src = tmp_path / "store"
    (src / "p1").mkdir(parents=True)
    (src / "p1" / "kernels.parquet").write_bytes(os.urandom(10_000))  # random: gzip cannot shrink it
    gpu.save(src, "store.tgz")
    pieces = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in pieces] == ["store.tgz.01", "store.tgz.02", "store.tgz.03"]
    assert all(p.stat().st_size <= 4096 for p in pieces)
    (tmp_path / "x").mkdir()
    subprocess.run(f"cat {tmp_path / 'out'}/store.tgz.* | tar xzf - -C {tmp_path / 'x'}", shell=True, check=True)
    assert (tmp_path / "x" / "store" / "p1" / "kernels.parquet").read_bytes() == \
        (src / "p1" / "kernels.parquet").read_bytes()
    (src / "p1" / "kernels.parquet").write_bytes(b"small")
    gpu.save(src, "store.tgz")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["store.tgz"]
