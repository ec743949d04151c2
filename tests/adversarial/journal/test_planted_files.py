"""Files an attacker who can write the run folder (or the witness's folder) plants where the tools read: a tree
index that is a link to /dev/zero or a FIFO, a witness state that anyone can write, that is a link or a FIFO.
Nothing hangs, nothing is read without bound, and the witness never cosigns on a memory someone else wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import step

from trainledger.journal import Journal, Signer
from trainledger.journal import proofs as T
from trainledger.journal.errors import UnsafePath


def _journal(path, signer, n=300):
    with Journal.create(path, signer=signer, background=False, seal_every=100) as j:
        for i in range(n):
            j.append(step(i))
    return path


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "trainledger", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("plant", ["link to /dev/zero", "fifo"])
def test_a_planted_tree_index_is_ignored_with_a_note_not_read_forever(tmp_path, signer, keypair, plant):
    pub = keypair[2]
    p = _journal(tmp_path / "j.jsonl", signer)
    idx = tmp_path / "j.jsonl.tlindex"
    if plant == "fifo":
        os.mkfifo(idx)
    else:
        idx.symlink_to("/dev/zero")
    r = _cli("prove", p, "--seq", 3, "-o", tmp_path / "b.json", "--pubkey", pub)
    assert r.returncode == 0, r.stderr
    assert "note:" in r.stderr and "tree index" in r.stderr and "ignored" in r.stderr
    assert len(T.verify_bundle((tmp_path / "b.json").read_bytes(), [signer.public]).events) == 1


def test_consistency_with_index_dev_zero_does_not_hang_or_replace_the_device(tmp_path, signer, keypair):
    import stat

    pub = keypair[2]
    p = _journal(tmp_path / "j.jsonl", signer)
    fifo = tmp_path / "index.fifo"
    os.mkfifo(fifo)
    for index in ("/dev/zero", fifo):
        r = _cli("consistency", p, "--from", 100, "--index", index, "-o", tmp_path / "c.json", "--pubkey", pub)
        assert r.returncode == 0, r.stderr
        assert "not a regular file" in r.stderr, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/zero").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)  # neither replaced


def _witness_setup(tmp_path, signer):
    p = _journal(tmp_path / "j.jsonl", signer, 150)
    bundle = json.dumps(T.prove(p, [1], keys=[signer.public]).bundle).encode()
    return T.Witness(tmp_path / "state.json", "w1", Signer.generate()._key), bundle


def test_a_witness_state_anyone_can_write_is_refused(tmp_path, signer):
    w, bundle = _witness_setup(tmp_path, signer)
    w.add(bundle, [signer.public])  # its own state, 0600
    st = tmp_path / "state.json"
    os.chmod(st, 0o666)
    st.write_text("{}")  # another user wipes its memory: a fork of a size it cosigned would pass
    with pytest.raises(UnsafePath, match="writable by no one else"):
        w.add(bundle, [signer.public])


@pytest.mark.parametrize("plant", ["link to /dev/zero", "fifo", "too large"])
def test_a_witness_state_that_is_no_plain_file_is_refused_at_once(tmp_path, signer, plant):
    w, bundle = _witness_setup(tmp_path, signer)
    st = tmp_path / "state.json"
    if plant == "fifo":
        os.mkfifo(st, 0o600)
    elif plant == "too large":
        with open(st, "wb") as f:
            f.truncate(T.witness.STATE_LIMIT + 1)
        os.chmod(st, 0o600)
    else:
        st.symlink_to("/dev/zero")
    with pytest.raises(UnsafePath, match="witness state"):
        w.add(bundle, [signer.public])


def test_a_rank_file_that_links_out_of_the_run_folder_is_refused(tmp_path, signer, keypair, capsys):
    from trainledger.cli import main

    pub = keypair[2]
    outside = _journal(tmp_path / "elsewhere.jsonl", signer, 5)
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-00000.jsonl").symlink_to(outside)
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 1
    err = capsys.readouterr().err
    assert "rank journal" in err and "outside" in err


def test_a_control_byte_in_a_node_name_is_not_copied_into_the_report(tmp_path, signer, keypair):
    pytest.importorskip("matplotlib")
    from trainledger.journal import StepObserved
    from trainledger.report import write_run_dir_report
    from trainledger.training.distributed.ranks import RankInfo, open_rank_journal

    run = tmp_path / "run"
    for r in range(2):
        info = RankInfo(run="job", rank=r, world_size=2, local_rank=r, node="node\x1b]0;owned\x07", restart_count=0)
        with open_rank_journal(run, signer, info=info) as j:
            for i in range(5):
                j.append(StepObserved(step=i, loss=1.0, step_time_s=0.01))
    write_run_dir_report(run, tmp_path / "r.html", keys=[signer.public])
    page = (tmp_path / "r.html").read_text()
    assert "\x1b" not in page and "\x07" not in page and "\\x1b" in page


def test_a_line_over_the_cap_is_not_written_and_gets_no_bundle(tmp_path, signer):
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    from trainledger.journal.errors import IntegrityError, UsageError
    from trainledger.training.kinds import RunStopped
    from trainledger.journal.scan import MAX_LINE

    j = Journal.create(tmp_path / "w.jsonl", signer=signer, background=False)
    with pytest.raises(UsageError, match="over the"):
        j.append(RunStopped(rule="x", reason="a" * MAX_LINE))
    j.close()
    # A key holder writes one anyway (by hand, re-signed): verify refuses the journal, and prove gives no bundle.
    p = _journal(tmp_path / "j.jsonl", signer, 20)
    lines = read_lines(p)
    obj = parse(lines[3])
    obj["loss"] = 1.0
    obj["huge"] = "a"
    lines[3] = dump(obj).replace(b'"huge":"a"', b'"huge":"' + b"a" * (MAX_LINE + 10) + b'"')
    write_lines(p, rechain(lines, resign=signer))
    with pytest.raises(IntegrityError):
        T.prove(p, [3], keys=[signer.public])
    b = T.prove(p, [1], keys=[signer.public]).bundle  # a line under the cap: proven
    b["entries"][0]["line"] = "a" * (MAX_LINE + 1)
    from trainledger.journal.merkle import ProofError

    with pytest.raises(ProofError, match="over the"):
        T.verify_bundle(json.dumps(b).encode(), [signer.public])
