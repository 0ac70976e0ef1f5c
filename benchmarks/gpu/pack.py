"""Prepare, on this machine, what a suite needs on the GPU machine and split it into parts that each travel in one
device call beside the working tree (64 MiB in all per call), then print the calls to make.

    .venv/bin/python benchmarks/gpu/pack.py data/suites/sglang-h200.yaml

What a suite needs: the suite's own wheels (papermill, nbconvert, ... : ../shared/tools/gpu-wheels.sh), Nsight Systems'
missing library (../shared/tools/gpu-nsys-libs.sh), and where the suite's engine lives in a site folder of its own
(engine.env PYTHONPATH), that engine's wheels (SGLang: ../shared/tools/gpu-sglang-wheels.sh). Each is built once into
.device/ (git-ignored); the parts are .device/parts/NN, with .device/parts/manifest.json naming every file, its size,
sha256 and part. benchmarks/gpu/on_gpu.py, on the GPU machine, gathers the parts across consecutive calls, checks them
against the manifest, and runs the suite once everything is there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / ".device"
TOOLS = ROOT.parent / "shared" / "tools"
LIMIT = 64 * 2**20  # what one device call carries: the working tree and the carried paths together
MARGIN = 3 * 2**20  # for files the tree gains before the calls are made (a store saved meanwhile)
SLIM_ABOVE = 16 * 2**20  # a tree larger than this leaves parts small enough to cost calls: slim_index.py says how

# where each kind of file lands on the GPU machine (on_gpu.py installs by kind)
SOURCES = {"suite": ("wheels", ["gpu-wheels.sh", "{dest}", "ijson"]),
           "nsys": ("nsys-lib", ["gpu-nsys-libs.sh", "{dest}"]),
           "sglang": ("sglang", ["gpu-sglang-wheels.sh", "{dest}"]),
           # the slim sm_90 vLLM wheel (xz'd, in pieces) and its missing dependencies, with the script that joins,
           # checks and installs them there (vllm-gpu/build.sh writes chunk1/ and chunk2/: they travel as one set)
           "vllm": ("vllm", ["vllm-gpu/build.sh", "{dest}"])}


def tree_bytes() -> int:
    """What the working tree carries: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in out.decode().split("\0") if p and (ROOT / p).is_file())


def needs(suite: Path) -> list[str]:
    """The kinds of files this suite needs on the GPU machine."""
    spec = yaml.safe_load(suite.read_text())
    engine = spec.get("engine") or {}
    kinds = ["suite", "nsys"]
    if engine.get("name") in ("sglang", "vllm") and (engine.get("env") or {}).get("PYTHONPATH"):
        kinds.append(engine["name"])
    elif (engine.get("env") or {}).get("PYTHONPATH"):
        raise SystemExit(f"{suite}: engine {engine.get('name')!r} lives in a site folder, but pack.py knows no wheel "
                         "builder for it")
    return kinds


def build(kind: str) -> Path:
    """The folder of one kind's files, built once with the shared tool."""
    folder, cmd = SOURCES[kind]
    dest = DEVICE / folder
    if not (dest.is_dir() and any(dest.iterdir())):
        tool = TOOLS / cmd[0]
        print(f"building {kind} files with {tool.name} into {dest.relative_to(ROOT)} ...", flush=True)
        subprocess.run(["bash", str(tool), *[a.format(dest=dest) for a in cmd[1:]]], check=True)
    chunks = sorted(dest.glob("chunk[0-9]"))
    if chunks:  # a tool that cut its set into chunk folders: one flat set (the chunks never share a name)
        for c in chunks:
            for f in c.iterdir():
                if (dest / f.name).exists() and sha256(dest / f.name) != sha256(f):
                    raise SystemExit(f"{f.name} differs between the chunk folders of {dest}")
                shutil.move(str(f), dest / f.name)
            shutil.rmtree(c)
    return dest


def sha256(f: Path) -> str:
    """sha256 of a file."""
    return hashlib.sha256(f.read_bytes()).hexdigest()


def cut(files: list[tuple[str, Path]], budget: int, into: Path) -> tuple[list[tuple[str, Path]], dict[str, dict]]:
    """Files larger than one call's budget cut into pieces NAME.piece-NN of at most budget bytes (on_gpu.py joins
    them and checks the whole): the files to split into parts, and per piece the whole it belongs to."""
    out, of = [], {}
    for kind, f in files:
        size = f.stat().st_size
        if size <= budget:
            out.append((kind, f))
            continue
        into.mkdir(parents=True, exist_ok=True)
        whole = {"name": f.name, "bytes": size, "sha256": sha256(f)}
        with open(f, "rb") as fh:
            for i in range(-(-size // budget)):
                piece = into / f"{f.name}.piece-{i:02d}"
                piece.write_bytes(fh.read(budget))
                out.append((kind, piece))
                of[piece.name] = whole
    return out, of


def split(files: list[tuple[str, Path]], budget: int) -> list[list[tuple[str, Path]]]:
    """First-fit, largest first, into parts of at most budget bytes."""
    parts: list[list[tuple[str, Path]]] = []
    room: list[int] = []
    for kind, f in sorted(files, key=lambda kf: -kf[1].stat().st_size):
        size = f.stat().st_size
        if size > budget:
            raise SystemExit(f"{f} is {size / 2**20:.1f} MiB, more than one call carries beside the tree "
                             f"({budget / 2**20:.1f} MiB): cut it first (cut)")
        i = next((i for i, r in enumerate(room) if r >= size), None)
        if i is None:
            parts.append([])
            room.append(budget)
            i = len(parts) - 1
        parts[i].append((kind, f))
        room[i] -= size
    return parts


def reference_card(suite: Path) -> str:
    """The GPU the suite's committed reference store was measured on ('' for none yet: a cold recording)."""
    import yaml

    from servescope.store import Store

    store = ROOT / "data" / "reference" / yaml.safe_load(suite.read_text())["name"] / "store"
    return str(Store(store).measured_where().get("gpu", "")) if store.is_dir() else ""


def main() -> None:
    """Build, split, write the manifest, print the calls."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", type=Path)
    ap.add_argument("--budget-s", type=int, default=540, help="seconds the suite may run in the last call")
    a = ap.parse_args()
    # whole MiB: the manifest is part of the tree, and a budget that moved with it by a few bytes repacked every run
    budget = (LIMIT - tree_bytes() - MARGIN) // 2**20 * 2**20
    if budget < 2**20:  # no room beside the tree: cutting into pieces of <= 0 bytes would pack nothing
        raise SystemExit(f"the tree alone is {tree_bytes() / 2**20:.1f} MiB of the {LIMIT / 2**20:.0f} a call carries: "
                         f"no room for parts; benchmarks/gpu/slim_index.py slim {a.suite}, then pack again")
    kinds = needs(a.suite)
    by_name: dict[str, tuple[list[str], Path]] = {}
    for k in kinds:
        for f in sorted(build(k).iterdir()):
            if not f.is_file():
                continue
            if f.name in by_name:  # a wheel both sets hold (pydantic, ...): it travels once, installed for both
                if sha256(by_name[f.name][1]) != sha256(f):
                    raise SystemExit(f"{f.name} differs between the {by_name[f.name][0]} and {k} sets")
                by_name[f.name][0].append(k)
                continue
            by_name[f.name] = ([k], f)
    files = [(",".join(ks), f) for ks, f in by_name.values()]
    out = DEVICE / "parts"
    shutil.rmtree(out, ignore_errors=True)
    files, of = cut(files, budget, DEVICE / "pieces")
    parts = split(files, budget)
    manifest = {"suite": str(a.suite), "parts": len(parts), "files": []}
    for n, part in enumerate(parts, 1):
        d = out / f"{n:02d}"
        d.mkdir(parents=True)
        for kind, f in part:
            shutil.copy2(f, d / f.name)
            manifest["files"].append({"name": f.name, "kinds": kind.split(","), "part": n, "bytes": f.stat().st_size,
                                      "sha256": sha256(f)} | ({"of": of[f.name]} if f.name in of else {}))
    shutil.rmtree(DEVICE / "pieces", ignore_errors=True)
    # the manifest travels in the tree (not ignored) so every call can check what it has against it
    target = ROOT / "benchmarks" / "gpu" / "parts.json"
    target.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f["bytes"] for f in manifest["files"])
    print(f"{len(files)} files, {total / 2**20:.1f} MiB, in {len(parts)} parts of at most {budget / 2**20:.1f} MiB "
          f"(the tree is {tree_bytes() / 2**20:.1f} MiB); manifest: {target.relative_to(ROOT)}")
    from slim_index import slimmed as is_slimmed  # beside this script (its folder is on sys.path when run)

    slimmed = is_slimmed(ROOT)
    if not slimmed and tree_bytes() > SLIM_ABOVE:
        print(f"The tree alone is {tree_bytes() / 2**20:.1f} MiB of the {LIMIT / 2**20:.0f} a call carries: take what "
              f"the GPU machine never reads out of it first (benchmarks/gpu/slim_index.py slim {a.suite}), then pack "
              "again.")
    card = reference_card(a.suite)
    gpu_name = f'GPU_NAME="{card}" ' if card else ""
    print("Make these device calls back to back (the machine keeps files 30 s after a call):")
    for n in range(1, len(parts) + 1):
        sent = ",".join(f"{i:02d}" for i in range(1, n))
        print(f"  run(carry=['.device/parts/{n:02d}'], command='SENT={sent} BUDGET_S={a.budget_s} {gpu_name}"
              f"python3 benchmarks/gpu/on_gpu.py {a.suite}')")
    if card:
        print(f"GPU_NAME: the reference store this recording continues was measured on {card}; a call that lands on "
              "another card stops before it stores or runs anything.")
    print("Each call before the last only stores its part; the last installs and runs the suite. Later calls of the "
          "same session (SENT=" + ",".join(f"{i:02d}" for i in range(1, len(parts) + 1)) + ", no carry) continue the "
          "store.")
    if slimmed:
        print("The index is slimmed: after the calls, before any commit, benchmarks/gpu/slim_index.py restore (and "
              "git checkout benchmarks/gpu/parts.json).")


if __name__ == "__main__":
    sys.exit(main())
