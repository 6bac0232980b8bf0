"""The harness that stops Airflow's components: by session, TERM twice, then KILL."""

from __future__ import annotations

import subprocess
import sys

from marin_testing.airflow import session_members, stop_session

# Ignores the first SIGTERM (as Airflow's scheduler can: "Signal again..."), exits on the second;
# its child moves to a process group of its own, as Airflow's task runners do.
STUBBORN = """
import signal, subprocess, sys, threading
terms = []
stop = threading.Event()
def on_term(*_):
    terms.append(1)
    if len(terms) >= 2:
        stop.set()
signal.signal(signal.SIGTERM, on_term)
child = subprocess.Popen(
    [sys.executable, "-c", "import threading; threading.Event().wait()"], process_group=0
)
print(child.pid, flush=True)
stop.wait()
sys.exit(3)
"""

# Ignores SIGTERM altogether: only SIGKILL stops it.
DEAF = """
import signal, threading
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
threading.Event().wait()
"""


def test_second_term_stops_the_component_and_its_regrouped_child() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    members = session_members(proc.pid)
    assert proc.pid in members and child in members
    stop_session(proc, grace=5)
    assert proc.returncode == 3, "the second SIGTERM should have ended it"
    assert session_members(proc.pid) == []


def test_kill_after_two_terms() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAF], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    stop_session(proc, grace=2)
    assert proc.returncode == -9
    assert session_members(proc.pid) == []
