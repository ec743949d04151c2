"""Usage and I/O mistakes: one line, exit 2, nothing half-written; queries that can be stopped."""

from __future__ import annotations

import time

import pytest
from conftest import step
from test_cli import run

from trainledger.journal import Journal, StepObserved
from trainledger.journal.views import query as q

from tests.helpers.signals import with_sigint


@pytest.fixture
def journal_file(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(20):
            j.append(step(i))
    return p


@pytest.fixture
def not_a_folder(tmp_path):
    """A path under a regular file: no folder can be made there (a read-only disk fails the same way, and
    root, which these tests may run as, cannot bypass it)."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file"


@pytest.mark.parametrize("fmt", ["csv", "json", "table", "parquet"])
def test_query_unwritable_out_is_an_io_error(journal_file, not_a_folder, capsys, fmt):
    code, _, err = run(capsys, "query", "--trust-embedded", "--format", fmt, "--out", not_a_folder / "r.out",
                       journal_file, "SELECT count(*) FROM steps")
    assert code == 2 and err.count("\n") == 1 and "r.out" in err


@pytest.mark.parametrize("argv", [
    ["demo", "--steps", "5", "{nf}/demo"],
    ["manifest", "init", "{nf}/exp"],
    ["ladder", "{nf}/ladder", "--peak-flops", "1e9"],
    ["report", "{j}", "--trust-embedded", "-o", "{nf}/r.html"],
])
def test_commands_writing_where_no_folder_can_be_made(journal_file, not_a_folder, capsys, argv):
    argv = [a.format(nf=not_a_folder, j=journal_file) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, (out, err)


def test_query_options_after_the_paths(journal_file, capsys):
    code, out, _ = run(capsys, "query", journal_file, "--trust-embedded", "--format", "json",
                       "SELECT count(*) AS n FROM steps")
    assert code == 0 and out.strip() == '[{"n": 20}]'


def test_query_timeout_interrupts_the_sql(journal_file, capsys):
    t0 = time.monotonic()
    code, _, err = run(capsys, "query", "--trust-embedded", "--timeout", "0.3", journal_file,
                       "SELECT count(*) FROM range(1000000000000) a, range(10) b")
    assert code == 2 and "--timeout" in err and time.monotonic() - t0 < 60  # ended by the timeout, not the query


@pytest.fixture(scope="module")
def big_journal(tmp_path_factory):
    from trainledger.journal import Signer

    p = tmp_path_factory.mktemp("big") / "j.jsonl"
    with Journal.create(p, signer=Signer.generate(), background=False) as j:
        for i in range(200_000):
            j.append(step(i))
    return p


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.02, 0.1, 0.25, 0.4, 0.55, 0.7, 1.5])
def test_ctrl_c_interrupts_a_query_at_any_moment(big_journal, delay):
    """From the moment the command owns Ctrl-C (the handshake: its package imported) through its start-up, the
    journal's verification and load, and the SQL: exit 130, one line, no abort, however loaded the machine (the
    delays only spread the moments; none is needed for the verdict)."""
    from signals import interrupted

    code, _, err = interrupted(["query", "--trust-embedded", "--timeout", "0", "--no-cache", str(big_journal),
                                "SELECT count(*) FROM range(1000000000000) a, range(10) b"], delay)
    assert code == 130 and "interrupted" in err and "Traceback" not in err and "FATAL" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_command_started_with_ctrl_c_ignored_keeps_ignoring_it(big_journal):
    """Started under nohup (or ``CMD &`` in a script, whose children ignore SIGINT so that the terminal's Ctrl-C
    is not theirs), a command ignores SIGINT to the end, as Python itself does: the query runs on until its own
    --timeout ends it (exit 2), never 130."""
    from signals import interrupted

    code, _, err = interrupted(["query", "--trust-embedded", "--timeout", "2", "--no-cache", str(big_journal),
                                "SELECT count(*) FROM range(1000000000000) a, range(10) b"], 0.3, sigint="SIG_IGN")
    assert code == 2 and err.startswith("trainledger query: error: the query ran longer than --timeout"), err


def test_integers_beyond_bigint_are_not_null_in_views(tmp_path, signer, pubkey):
    p = tmp_path / "big.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        j.append(StepObserved(step=2**64 - 1, loss=1.0, tokens=2**63 + 7))
    con = q.connect([p], keys=[pubkey], use_cache=False)
    assert con.execute("SELECT step, tokens FROM steps").fetchall() == [(2**64 - 1, 2**63 + 7)]


def test_warm_cache_is_used_for_relative_paths(journal_file, pubkey, monkeypatch):
    monkeypatch.chdir(journal_file.parent)
    q.build_cache([journal_file.name], keys=[pubkey])
    con, source = q.open_views([journal_file.name], keys=[pubkey])
    assert source.origin == "cache" and con.execute("SELECT count(*) FROM steps").fetchone() == (20,)


def test_query_connections_do_not_autoinstall_extensions(journal_file, pubkey):
    con = q.connect([journal_file], keys=[pubkey], use_cache=False)
    assert con.execute("SELECT current_setting('autoinstall_known_extensions')").fetchone() == (False,)


def test_a_ctrl_c_that_a_library_swallowed_still_ends_the_command(tmp_path):
    """A KeyboardInterrupt raised where it is only printed (a __del__, a C callback) or swallowed by a library, and
    a command that then goes on in code that never returns: the interrupt is not lost. A watchdog ends the command
    LOST_INTERRUPT_S after the Ctrl-C, journals suspended, exit 130, one line, no traceback."""
    import signal
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import faulthandler, time
        faulthandler.dump_traceback_later(40)  # still running then: every thread's stack on stderr, for the failure
        from trainledger.cli import journal as cli
        from trainledger.journal import Journal, Signer, StepObserved
        cli.LOST_INTERRUPT_S = 1.0
        def main():
            j = Journal.create(sys.argv[1], signer=Signer.generate(), seal_every=10_000)
            j.append(StepObserved(step=0, loss=1.0))
            print("READY", flush=True)
            try:
                time.sleep(120)
            except KeyboardInterrupt:
                pass  # a library that swallowed it
            time.sleep(120)  # and went on
            return 0
        import sys
        cli.entry(main)
    ''')
    proc = subprocess.Popen(with_sigint("SIG_DFL", [sys.executable, "-c", script, str(tmp_path / "j.jsonl")]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    late = False
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            late = True
    finally:
        proc.kill()
        out, err = proc.communicate()
    assert not late, f"still running 60 s after Ctrl-C; its stderr (threads' stacks at 40 s):\n{err[-6000:]}"
    assert proc.returncode == 130 and err.strip() == "trainledger: interrupted", err
    from trainledger.journal import verify

    r = verify(tmp_path / "j.jsonl", allow_unsealed=True, trust_embedded=True)
    assert r.ok and r.unsealed_events == 0 and r.kinds["step_observed"] == 1  # suspended: sealed, durable
