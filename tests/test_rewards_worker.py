"""Worker processes: messages of any size cross both ways, a worker is stopped with what it started, dies with the
process that started it, and a forked child of that process lets go of it without stopping it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from test_rewards_isolated import _gone

from grpo_cli.rewards.worker import Worker, parent_channel


def echo() -> None:
    """Served in a worker: each message back as it came."""
    channel = parent_channel()
    for message in channel.incoming():
        channel.send(message)


def starts_a_sleeper() -> None:
    """Served in a worker: starts `sleep` and says its pid."""
    channel = parent_channel()
    sleeper = subprocess.Popen(["sleep", "300"])
    channel.send(str(sleeper.pid).encode())
    for _ in channel.incoming():
        pass


def sleeps() -> None:
    """Served in a worker: says it is up, then never reads its input (so never sees it close)."""
    parent_channel().send(b"up")
    time.sleep(300)


def test_messages_larger_than_a_pipe_and_empty_ones_cross_both_ways():
    worker = Worker(echo)
    try:
        large = os.urandom(3 << 20)  # 3 MiB: many reads of a 64 KiB pipe
        for message in (large, b"", b"x"):
            worker.channel.send(message)
            assert worker.channel.receive(time.monotonic() + 60) == message
    finally:
        assert worker.stop() is not None
    assert worker.proc.poll() is not None


def test_stopping_a_worker_stops_what_it_started():
    worker = Worker(starts_a_sleeper)
    try:
        sleeper = int(worker.channel.receive(time.monotonic() + 60))
    finally:
        worker.stop()
    assert _gone(sleeper)


PARENT = """
import sys, time
sys.path[:] = sys.argv[1:]
from grpo_cli.rewards.worker import Worker
from test_rewards_worker import sleeps
worker = Worker(sleeps)
worker.channel.receive(None)
print(worker.proc.pid, flush=True)
time.sleep(300)
"""


def test_a_worker_dies_with_the_process_that_started_it():
    """Killed, so that nothing of that process's own runs at its end: the kernel ends the worker."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *map(str, sys.path)], stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert _gone(pid)


def test_a_forked_child_lets_go_of_its_parents_worker():
    worker = Worker(echo)
    try:
        child = os.fork()
        if child == 0:
            code = 1
            try:
                worker.stop()  # in the child: closes its copies of the pipes, signals nothing
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(child, 0)[1] == 0
        worker.channel.send(b"still there")
        assert worker.channel.receive(time.monotonic() + 60) == b"still there"
    finally:
        worker.stop()
