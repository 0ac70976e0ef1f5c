#!/usr/bin/env python3
"""A stand-in for nvidia-cuda-mps-control in unit tests (the real one is exercised on the H200): `-d` starts a
detached daemon process that writes its pid file into CUDA_MPS_PIPE_DIRECTORY and runs until told to quit; without
arguments it reads one command from stdin (quit, get_server_list, get_client_list PID,
set_default_active_thread_percentage N). The test writes the server and client lists it answers with into files of
the pipe directory. STUB_MPS_FAIL_START=1 makes `-d` fail as a driver without MPS would."""

import os
import sys
import time
from pathlib import Path

pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))

if sys.argv[1:] == ["-d"]:
    if os.environ.get("STUB_MPS_FAIL_START") == "1":
        print("An instance of this daemon is already running or MPS is not supported", file=sys.stderr)
        sys.exit(1)
    if os.fork():
        sys.exit(0)  # the caller's `-d` returns at once, as the real one does
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)  # a daemon lets go of its caller's terminal and pipes
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    (logs / "control.log").write_text("[stub] control daemon started\n")
    while not (pipe / "quit_requested").exists():
        time.sleep(0.05)
    (pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
    os._exit(0)

cmd = sys.stdin.read().split()
if not cmd:
    sys.exit(0)
if cmd[0] == "quit":
    (pipe / "quit_requested").write_text("")
elif cmd[0] == "get_server_list":
    f = pipe / "servers"
    print(f.read_text() if f.exists() else "")
elif cmd[0] == "get_client_list":
    f = pipe / f"clients-{cmd[1]}"
    print(f.read_text() if f.exists() else "")
elif cmd[0] == "set_default_active_thread_percentage":
    print(cmd[1])
else:
    print(f"unknown command {cmd[0]}", file=sys.stderr)
    sys.exit(1)
