"""Sending Ctrl-C to a ``python -m trainledger`` child at a moment the command owns, never during the interpreter's
own start (which no Python code can handle): a handshake, not a sleep. The child runs with ``-X importtime``, which
writes a line to stderr as each module finishes importing; once ``trainledger`` (the package, whose first lines
install the command's Ctrl-C handling) has finished, the command owns SIGINT. The rest of stderr is drained in a
thread and returned without those lines."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time


def with_sigint(disposition: str, argv: list[str]) -> list[str]:
    """``argv`` (a program and its arguments) run with SIGINT's disposition ``"SIG_DFL"`` (as from a terminal) or
    ``"SIG_IGN"`` (as under ``nohup`` or ``CMD &`` in a script), whatever this process has: a child inherits an
    ignored SIGINT, and a suite started in the background would otherwise test the wrong thing. ``exec`` keeps both."""
    assert disposition in ("SIG_DFL", "SIG_IGN")
    return [sys.executable, "-c", f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{disposition}); "
            "os.execv(sys.argv[1], sys.argv[1:])", *argv]


def interrupted(argv: list[str], delay: float, timeout: float = 60.0, sigint: str = "SIG_DFL") -> tuple[int, str, str]:
    """Run ``python -X importtime -m trainledger ARGV`` as from a terminal (``sigint``: or as under nohup), send
    SIGINT ``delay`` seconds after the package's import finished, and return (exit code, stdout, stderr without the
    import-time lines)."""
    proc = subprocess.Popen(with_sigint(sigint, [sys.executable, "-X", "importtime", "-m", "trainledger", *argv]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = threading.Event()
    err: list[str] = []

    def drain() -> None:
        for line in proc.stderr:
            if line.startswith("import time:"):
                if line.rstrip().endswith("| trainledger"):
                    ready.set()
                continue
            err.append(line)
        ready.set()  # it exited first: the caller's assertions say why
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    assert ready.wait(timeout), "the command never finished importing trainledger"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    try:  # bounded: a Ctrl-C the command lost must fail this test, never hang the suite
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv[0]}: still running {timeout:.0f} s after Ctrl-C (sent {delay} s after the "
                             "package's import): the interrupt was lost") from None
    out = proc.stdout.read()
    t.join(timeout)
    proc.stdout.close()
    proc.stderr.close()
    return proc.returncode, out, "".join(err)
