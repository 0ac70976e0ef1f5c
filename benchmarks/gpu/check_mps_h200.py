"""The suite's MPS control daemon on the real driver (the H200 machine): refusal checks from NVML, start in private
directories, two CUDA processes as its clients (found in its server's client list), stop, and nothing left (no
daemon, no server, no directory). Prints one JSON line; run through the device tool:
    PYTHONPATH=lib /opt/torch/.venv/bin/python3 benchmarks/gpu/check_mps_h200.py"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml

from servescope import mps

CLIENT = ("import torch, time; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
          "print('ready', flush=True); time.sleep(20)")


def gpu_facts() -> list[mps.GpuFacts]:
    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mode = {0: "Default", 2: "Prohibited", 3: "Exclusive_Process"}.get(pynvml.nvmlDeviceGetComputeMode(h), "?")
        try:
            mig = bool(pynvml.nvmlDeviceGetMigMode(h)[0])
        except pynvml.NVMLError:
            mig = False
        out.append(mps.GpuFacts(i, mode, mig, pynvml.nvmlDeviceGetCudaComputeCapability(h)))
    return out


def main() -> None:
    facts = gpu_facts()
    rep: dict = {"gpus": [f.__dict__ for f in facts], "refusal": mps.refusal(facts),
                 "existing_before": mps.existing_daemon()}
    t0 = time.time()
    with mps.MpsDaemon(active_thread_pct=50) as d:
        rep |= {"root": str(d.root), "daemon_pid": d.pid, "started_s": round(time.time() - t0, 2)}
        env = dict(os.environ) | d.client_env()
        clients = [subprocess.Popen([sys.executable, "-c", CLIENT], env=env, stdout=subprocess.PIPE, text=True)
                   for _ in range(2)]
        rep["clients_ready"] = [c.stdout.readline().strip() for c in clients]  # type: ignore[union-attr]
        rep["servers"] = d.servers()
        rep["clients"] = d.clients()
        rep["check"] = d.check_clients({i: [c.pid] for i, c in enumerate(clients)})
        rep["server_log"] = (d.log_dir / "server.log").read_text()[-400:] if (d.log_dir / "server.log").exists() \
            else ""
        for c in clients:
            c.kill()
            c.wait()
        root, pid, servers = d.root, d.pid, rep["servers"]
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True).stdout
    rep |= {"after_root_exists": Path(str(root)).exists(),
            "after_daemon_alive": any(line.split()[0] == str(pid) for line in ps.splitlines()[1:]),
            "after_mps_processes": [ln.strip() for ln in ps.splitlines() if "mps" in ln],
            "after_servers_alive": [s for s in servers if Path(f"/proc/{s}").exists()],
            "existing_after": mps.existing_daemon()}
    print(json.dumps(rep))


if __name__ == "__main__":
    main()
