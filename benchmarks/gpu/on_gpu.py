"""Run a suite on the GPU machine: the one entry point for every H200 recording (device calls, from the repository
root). Standard library only: it runs before anything is installed.

    SENT=01,02 BUDGET_S=540 ONLY="--only 02" GPU_NAME=H200 python3 benchmarks/gpu/on_gpu.py data/suites/sglang-h200.yaml

What it needs travels in parts (benchmarks/gpu/pack.py splits it; benchmarks/gpu/parts.json lists every file with its
part and sha256), one part per call, carried as .device/parts/NN. Each call:
1. checks that what earlier calls left is still here (SENT names the parts sent before this call; a fresh machine has
   none of them, and it says so: send them again);
2. stores the part it carries (sha256 checked) under /tmp/ssgpu/files;
3. when every part is here, installs once (the suite's wheels into /tmp/site, an engine's wheels into the site folder
   its suite names in engine.env PYTHONPATH, Nsight Systems' library), then runs the suite in what is left of BUDGET_S
   seconds counted from the call's start (set it below the call's time limit: the install comes out of it),
   continuing /tmp/ssgpu/stores/<name> (started from the suite's committed reference store, data/reference/<name>/store,
   when there is one, so a recording continues across sessions), saving the store into $OUT every 15 s; the suite
   itself launches no point that would not finish within the budget (servescope run --budget-s), the SIGTERM at
   BUDGET_S stays as the backstop;
   (GPU_NAME, where given, stops the call at once on another card; a store measured on another GPU model is not
   continued);
4. leaves no suite, server, engine process or MPS daemon behind (checked, and killed if found, also when the driver
   itself fails), and says what it found; a suite an earlier call left running is stopped before this one starts.
$OUT gets store.tgz, reports.tgz, run.log, gpu.txt; an archive over 15 MiB comes as pieces (store.tgz.01, .02, ...:
a file over 16 MiB is not brought back), joined here by `cat store.tgz.* | tar xzf -`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = Path("/tmp/ssgpu")
NSYS = Path("/opt/nvidia/nsight-compute/2025.3.1/host")
OUT = Path(os.environ.get("OUT", "/tmp/ssgpu-out"))
PIECE_BYTES = 15 * 2**20  # the device brings back files of at most 16 MiB: a larger archive comes in pieces
LEFTOVERS = ("servescope.cli run", "sglang.launch_server", "sglang::", "vllm.entrypoints", "transformers serve",
             "transformers.cli",
             "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def say(msg: str) -> None:
    """One timestamped line."""
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def boot_id() -> str:
    """This machine's boot id: a fresh machine has another."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def sha(p: Path) -> str:
    """sha256 of a file."""
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def gather(manifest: dict) -> tuple[list[int], list[int]]:
    """Store the carried parts (checked), then (parts complete here, parts missing)."""
    files = WORK / "files"
    files.mkdir(parents=True, exist_ok=True)
    want = {f["name"]: f for f in manifest["files"]}
    for d in sorted((ROOT / ".device" / "parts").glob("[0-9][0-9]")):
        for f in sorted(d.iterdir()):
            meta = want.get(f.name)
            if meta is None:
                raise SystemExit(f"{f} is not in benchmarks/gpu/parts.json: pack again (pack.py) and send every part")
            if sha(f) != meta["sha256"]:
                raise SystemExit(f"{f}: sha256 differs from parts.json: the part was changed after packing")
            shutil.copy2(f, files / f.name)
        say(f"part {d.name}: {len(list(d.iterdir()))} files stored")
    have, missing = set(), set()
    for name, meta in want.items():
        p = files / name
        whole = files / meta["of"]["name"] if "of" in meta else None
        here = (p.is_file() and p.stat().st_size == meta["bytes"]) or (whole is not None and whole.is_file())
        (have if here else missing).add(meta["part"])
    if not missing:
        join(manifest, files)
    return sorted(have - missing), sorted(missing)


def join(manifest: dict, files: Path) -> None:
    """Files pack.py cut into pieces (NAME.piece-NN), joined once every piece is here and checked as a whole."""
    wholes: dict[str, dict] = {}
    for f in manifest["files"]:
        if "of" in f:
            wholes.setdefault(f["of"]["name"], f["of"] | {"pieces": []})["pieces"].append(f["name"])
    for name, w in wholes.items():
        target = files / name
        if target.is_file() and target.stat().st_size == w["bytes"]:
            continue
        with open(target.with_suffix(target.suffix + ".tmp"), "wb") as out:
            for piece in sorted(w["pieces"]):
                out.write((files / piece).read_bytes())
        target.with_suffix(target.suffix + ".tmp").replace(target)
        if sha(target) != w["sha256"]:
            raise SystemExit(f"{name}: joined from {len(w['pieces'])} pieces, its sha256 differs from parts.json")
        for piece in w["pieces"]:
            (files / piece).unlink()
        say(f"joined {name} from {len(w['pieces'])} pieces")


def check_machine(sent: list[int]) -> None:
    """A call after others expects what they left; a fresh machine has none of it: say so and stop."""
    mark = WORK / "boot_id"
    if mark.is_file() and mark.read_text().strip() != boot_id():
        raise SystemExit("this is another machine than the earlier calls' (boot id changed): send every part again")
    got = {int(x) for x in (WORK / "received").read_text().split()} if (WORK / "received").is_file() else set()
    lost = [p for p in sent if p not in got]
    if lost:
        raise SystemExit(f"the machine changed: part(s) {', '.join(f'{p:02d}' for p in lost)} sent by earlier calls "
                         f"are not here (this machine, boot id {boot_id()[:8]}, is fresh: it went back while idle). "
                         "Send the parts again from 01, back to back.")
    WORK.mkdir(parents=True, exist_ok=True)
    mark.write_text(boot_id())


def gpu_names() -> list[str]:
    """The GPUs' names as nvidia-smi gives them ('NVIDIA H200'), one per GPU."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]


def check_card(want: str) -> None:
    """GPU_NAME=H200: stop at once on a machine whose GPU is another (a call without a kind may get an H100), before
    any part is stored: repetitions of one recording measured on two cards would be compared as one."""
    if not want:
        return
    names = gpu_names()
    if not any(want in n for n in names):
        raise SystemExit(f"this machine's GPU is {', '.join(names) or 'none nvidia-smi names'}, not the {want} the call "
                         "asked for (GPU_NAME): nothing stored, nothing run")


def check_store_card(store: Path, env: dict[str, str]) -> None:
    """A store continued here (the reference the recording goes on from) holds points measured on one GPU model:
    stop before launching when this machine's is another, naming both (the store's keys do not hold the card, so
    its points would be read as this machine's)."""
    code = ("import sys; from servescope.store import Store; "
            "print(Store(sys.argv[1]).measured_where().get('gpu', ''))")
    got = subprocess.run([sys.executable, "-c", code, str(store)], env=env, capture_output=True, text=True)
    if got.returncode:
        raise SystemExit(f"reading where the store's points were measured failed: {got.stderr.strip()[-500:]}")
    theirs, ours = got.stdout.strip(), gpu_names()
    if theirs and ours and theirs not in ours:
        raise SystemExit(f"the store this suite continues was measured on {theirs}; this machine has {', '.join(ours)}:"
                         " not continued (its repetitions would mix two cards). Ask for that card (GPU_NAME, the call's"
                         " kind), or record into another suite's store")


def install(manifest: dict, suite: dict) -> dict[str, str]:
    """Install what the parts hold, once per machine; the environment the suite runs with."""
    files = WORK / "files"
    kinds: dict[str, list[Path]] = {}
    for f in manifest["files"]:
        path = files / (f["of"]["name"] if "of" in f else f["name"])
        for kind in f.get("kinds") or [f["kind"]]:
            if path not in kinds.setdefault(kind, []):
                kinds[kind].append(path)
    site = "/tmp/site"
    engine_site = ((suite.get("engine") or {}).get("env") or {}).get("PYTHONPATH", "")
    if not (WORK / "installed").is_file():
        t0 = time.monotonic()
        if kinds.get("vllm"):
            _install_vllm(kinds["vllm"], engine_site, (suite.get("engine") or {}).get("python") or sys.executable)
        for kind, target in (("suite", site), ("sglang", engine_site)):
            wheels = [str(w) for w in kinds.get(kind, []) if w.suffix == ".whl"]
            if not wheels:
                continue
            if not target:
                raise SystemExit(f"{kind} wheels travelled, but the suite names no site folder for them")
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", target, *wheels], check=True)
            say(f"installed {len(wheels)} {kind} wheels into {target}")
        nsys = WORK / "nsys-lib"
        nsys.mkdir(exist_ok=True)
        for f in kinds.get("nsys", []):
            shutil.copy2(f, nsys / f.name, follow_symlinks=True)
        (WORK / "installed").write_text(f"{time.monotonic() - t0:.0f} s\n")
        say(f"installed in {time.monotonic() - t0:.0f} s")
    env = dict(os.environ)
    env |= {"PYTHONPATH": f"{site}:{ROOT / 'lib'}", "SERVESCOPE_CACHE": str(WORK / "cache"),
            "JUPYTER_PATH": f"{site}/share/jupyter", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "LD_LIBRARY_PATH": f"{WORK / 'nsys-lib'}:{env.get('LD_LIBRARY_PATH', '')}",
            # SGLang JIT-compiles a few kernels with ninja, which the torch environment's bin holds
            "PATH": f"{NSYS / 'target-linux-x64'}:{NSYS / 'linux-desktop-glibc_2_11_3-x64'}:/opt/torch/.venv/bin:"
                    f"{env.get('PATH', '')}",
            # NVLink multicast stays off on these machines (KINDS.md), for every process the suite starts
            "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    return env


def _install_vllm(files: list[Path], target: str, python: str) -> None:
    """The slim vLLM set (../shared/tools/vllm-gpu: pieces of an xz'd wheel, its dependencies, SHA256SUMS and
    install_on_gpu.sh) joined, checked and installed into the engine's site folder, under the engine's interpreter."""
    if not target:
        raise SystemExit("vllm files travelled, but the suite names no site folder (engine.env PYTHONPATH) for them")
    folder = WORK / "vllm-set"
    folder.mkdir(exist_ok=True)
    for f in files:
        if not (folder / f.name).exists():
            os.link(f, folder / f.name)
    t0 = time.monotonic()
    subprocess.run(["bash", str(folder / "install_on_gpu.sh"), str(folder), target], check=True,
                   env={**os.environ, "PY": python})
    say(f"installed vLLM into {target} in {time.monotonic() - t0:.0f} s")


def save(src: Path, name: str, exclude_logs_over: int = 8 * 2**20) -> None:
    """Tar a folder into $OUT atomically (server logs over the size left out: they are not data). The suite writes
    while this reads: a file that goes between the listing and the read (a point moved out of _partial when it
    completes) is left out of this copy, and the next save, 15 s later, has it where it went."""
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / f".{name}.part"
    top = name.split(".")[0]  # store/, reports/: the same names whatever the suite
    with tarfile.open(tmp, "w:gz") as tf:
        for folder, dirs, files in os.walk(src):
            dirs.sort()
            rel = Path(folder).relative_to(src)
            for entry in [folder, *(os.path.join(folder, f) for f in sorted(files))]:
                arc = str(Path(top) / rel) if entry == folder else str(Path(top) / rel / Path(entry).name)
                try:
                    ti = tf.gettarinfo(entry, arcname=arc)
                    if ti.isfile():
                        if ti.size > exclude_logs_over and entry.endswith(".log"):
                            continue
                        with open(entry, "rb") as fh:
                            tf.addfile(ti, fh)
                    else:
                        tf.addfile(ti)
                except FileNotFoundError:
                    continue
    for old in OUT.glob(f"{name}.[0-9][0-9]"):
        old.unlink()
    if tmp.stat().st_size <= PIECE_BYTES:
        os.replace(tmp, OUT / name)
        return
    (OUT / name).unlink(missing_ok=True)
    with open(tmp, "rb") as fh:
        for i, chunk in enumerate(iter(lambda: fh.read(PIECE_BYTES), b""), start=1):
            (OUT / f".{name}.{i:02d}").write_bytes(chunk)
            os.replace(OUT / f".{name}.{i:02d}", OUT / f"{name}.{i:02d}")
    tmp.unlink()


def leftovers() -> list[str]:
    """Processes a suite may have started that are still running."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    me = str(os.getpid())
    return [ln.strip() for ln in out if any(k in ln for k in LEFTOVERS) and not ln.strip().startswith(me)]


def suite_store(name: str) -> Path:
    """The store a suite continues on this machine, one per suite name (two suites recorded on one warm machine never
    continue each other's): the committed reference store where there is one, else empty (a cold recording)."""
    store = WORK / "stores" / name
    if not store.is_dir():
        ref = ROOT / "data" / "reference" / name / "store"
        if ref.is_dir():
            shutil.copytree(ref, store)
            say(f"store continues {ref.relative_to(ROOT)} ({sum(1 for _ in store.iterdir())} entries)")
        else:
            store.mkdir(parents=True)
            say(f"store starts empty: data/reference/{name}/store is not in the repository (a cold recording)")
    return store


# what the suite's own budget leaves of the driver's: its start and its report after the last point
SUITE_MARGIN_S = 15.0


def suite_command(suite_path: str, store: Path, reports: Path, only: list[str], budget_s: float) -> list[str]:
    """The suite through servescope run, continuing the store, into the reports folder; it launches no point that
    would not finish within the budget (a point cut off by the driver's SIGTERM spent its minutes for nothing)."""
    return [sys.executable, "-m", "servescope.cli", "run", suite_path, "--store-dir", str(store), "--reports-dir",
            str(reports), "--run-id", f"gpu-{time.strftime('%H%M%S')}",
            "--budget-s", f"{max(budget_s - SUITE_MARGIN_S, 1.0):.0f}", *only]


def run_suite(suite_path: str, name: str, env: dict[str, str], budget_s: float, only: list[str]) -> int:
    """The suite through servescope run, under the budget, the store saved every 15 s. Whatever ends this driver
    (an error here, an interrupt) stops the suite first: a suite left running would go on launching servers on the
    warm machine after the call returned, its log gone with the call's $OUT."""
    store, reports = suite_store(name), WORK / "reports" / name
    cmd = suite_command(suite_path, store, reports, only, budget_s)
    say("running: " + " ".join(cmd))
    log = open(OUT / "run.log", "a")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    t0, last = time.monotonic(), 0.0
    stopping = False
    try:
        while proc.poll() is None:
            time.sleep(1)
            now = time.monotonic()
            if now - last > 15:
                try:
                    save(store, "store.tgz")
                except OSError as e:  # a copy that failed loses nothing: the store is still on this machine
                    say(f"saving the store failed this time ({e}); the next save tries again")
                last = now
            if not stopping and now - t0 > budget_s:
                say(f"budget of {budget_s:.0f} s spent: stopping the suite (SIGTERM; it writes the report of what ran)")
                os.killpg(proc.pid, signal.SIGTERM)
                stopping = True
            if stopping and now - t0 > budget_s + 60:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            say("the driver is ending with the suite still running: stopping it (SIGTERM, then SIGKILL after 60 s)")
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    say(f"suite ended with {proc.returncode} after {time.monotonic() - t0:.0f} s")
    save(store, "store.tgz")
    if reports.is_dir():
        save(reports, "reports.tgz")
    return proc.returncode


def main() -> int:
    """Check, gather, install, run, clean up."""
    suite_path = sys.argv[1]
    sent = [int(x) for x in os.environ.get("SENT", "").replace(",", " ").split()]
    # BUDGET_S counts from this call's start, as the caller's time limit does: the parts and the install come out of it
    started, budget_s = time.monotonic(), float(os.environ.get("BUDGET_S", "540"))
    only = os.environ.get("ONLY", "").split()
    OUT.mkdir(parents=True, exist_ok=True)
    check_card(os.environ.get("GPU_NAME", ""))
    check_machine(sent)
    manifest = json.loads((ROOT / "benchmarks" / "gpu" / "parts.json").read_text())
    have, missing = gather(manifest)
    (WORK / "received").write_text(" ".join(map(str, have)))
    if missing:
        say(f"have part(s) {have or 'none'} of {manifest['parts']}; waiting for {missing}: make the next call now")
        return 0
    import yaml  # the image has PyYAML

    suite = yaml.safe_load(Path(suite_path).read_text())
    env = install(manifest, suite)
    check_store_card(suite_store(suite["name"]), env)
    subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,memory.total", "--format=csv"],
                   stdout=open(OUT / "gpu.txt", "w"), stderr=subprocess.STDOUT)
    # a SIGTERM to this driver (the call's time limit) runs the clean-up below instead of leaving the suite running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    earlier = leftovers()  # an earlier call's suite still running would write the same store
    for ln in earlier:
        os.kill(int(ln.split()[0]), signal.SIGKILL)
    if earlier:
        say(f"an earlier call left these running; killed before this run: {earlier}")
    left_s = budget_s - (time.monotonic() - started)
    say(f"the suite gets {left_s:.0f} s of BUDGET_S={budget_s:.0f} (this call spent {budget_s - left_s:.0f} s before it)")
    try:
        return run_suite(suite_path, suite["name"], env, left_s, only)
    finally:
        time.sleep(5)  # the MPS daemon's reaper needs a moment after a kill
        left = leftovers()
        for ln in left:
            os.kill(int(ln.split()[0]), signal.SIGKILL)
        say("left behind: none" if not left else f"left behind and killed now: {left}")


if __name__ == "__main__":
    sys.exit(main())
