"""Every rank of a run folder is bound to its own key: a key holder who rewrites another rank's journal under their
own key fails ``verify RUN_DIR`` by name, held to the operator's roster (``--roster``) or to rank 0's signed record
of the keys the ranks anchored with (``ranks_anchored.keys``, ``anchor_recorded.key``)."""

from __future__ import annotations

import shutil

import pytest

from trainledger.cli import main
from trainledger.journal import KeyFileError, Signer, StepObserved, TrustPolicy
from trainledger.journal.roster import Roster, RosterMismatch, load_roster
from trainledger.journal.audit.rundir import verify_run_dir
from trainledger.journal.kinds import AnchorRecorded, RanksAnchored
from trainledger.training.distributed.ranks import RankInfo, anchor_record, open_rank_journal


def _folder(d, signers, rounds=2, run="runK", snapshot=None):
    """A run folder whose rank r is signed by ``signers[r]``, anchored ``rounds`` times the way anchor_ranks does
    (every rank's sealed head and key id gathered, then recorded by each rank). ``snapshot``: {rank: path}: that
    rank's journal copied there right after its first round's seal (what it was before rank 0's second anchor)."""
    world = len(signers)
    js = [open_rank_journal(d, s, info=RankInfo(run=run, rank=r, world_size=world, local_rank=0, node=f"node-{r}",
                                                restart_count=0)) for r, s in enumerate(signers)]
    for k in range(rounds):
        for j in js:
            for i in range(5):
                j.append(StepObserved(step=5 * k + i, loss=2.0))
            j.seal()
        if k == 0:
            for r, dest in (snapshot or {}).items():
                shutil.copy(d / f"rank-{r:05d}.jsonl", dest)
        got = [("%d:%s" % j.head, j.key_id) for j in js]
        for r, j in enumerate(js):
            j.append(anchor_record(r, got, step=5 * k + 4))
    for j in js:
        j.close()
    return d


@pytest.fixture
def keys():
    return [Signer.generate() for _ in range(4)]


def _pins(keys):
    return [k.public for k in keys]


def _roster_file(path, keys, ranks=None):
    path.write_text("# rank  key\n" + "".join(f"{r} {keys[r].public.line()}\n" for r in (ranks or range(len(keys)))))
    return path


def test_the_anchors_record_which_key_signs_which_rank(tmp_path, keys):
    run = _folder(tmp_path / "run", keys)
    r = verify_run_dir(run, keys=_pins(keys))
    assert r.keys_bound_by == "recorded"
    from trainledger.journal import read_events

    anchored = [ev for ev in read_events(run / "rank-00000.jsonl") if isinstance(ev, RanksAnchored)]
    assert anchored[-1].keys == {str(i): k.key_id for i, k in enumerate(keys)}
    recorded = [ev for ev in read_events(run / "rank-00002.jsonl") if isinstance(ev, AnchorRecorded)]
    assert recorded[-1].key == keys[0].key_id


def test_rank_1s_key_holder_rewriting_rank_0_is_named_by_the_other_ranks_records(tmp_path, keys):
    honest = _folder(tmp_path / "honest", keys)
    forged = _folder(tmp_path / "forged", [keys[1], keys[1], keys[2], keys[3]])  # rank 0 written under key 1
    for name in ("rank-00000.jsonl", "rank-00001.jsonl"):  # the attacker holds rank 1 and rewrites rank 0
        shutil.copy(forged / name, honest / name)
    with pytest.raises(RosterMismatch, match=rf"rank 0: signed by key {keys[1].key_id}, but rank 2 recorded at its "
                                             rf"seq \d+ that rank 0 signs with key {keys[0].key_id}"):
        verify_run_dir(honest, keys=_pins(keys))


def test_rank_1s_key_holder_rewriting_rank_2_is_named_by_rank_0s_record(tmp_path, keys, capsys):
    honest = _folder(tmp_path / "honest", keys)
    forged = _folder(tmp_path / "forged", [keys[0], keys[1], keys[1], keys[3]])
    shutil.copy(forged / "rank-00002.jsonl", honest / "rank-00002.jsonl")
    with pytest.raises(RosterMismatch, match=rf"rank 2: signed by key {keys[1].key_id}, but rank 0 recorded"):
        verify_run_dir(honest, keys=_pins(keys))
    listing = tmp_path / "trusted"
    listing.write_text("".join(k.public.line() + "\n" for k in keys))
    pins = [a for k in range(4) for a in ("--pubkey", str(_one(tmp_path, keys[k], k)))]
    assert main(["verify", *pins, str(honest)]) == 1
    assert "rank 2: signed by key" in capsys.readouterr().out


def _one(tmp_path, signer, i):
    p = tmp_path / f"k{i}.pub"
    p.write_text(signer.public.line() + "\n")
    return p


def test_in_a_two_rank_run_only_the_operators_roster_stops_rank_1_rewriting_rank_0(tmp_path, keys, capsys):
    """The attacker holds every key but rank 0's: the whole folder can be rewritten consistently under key 1, and
    only a roster pinned by the operator names it."""
    forged = _folder(tmp_path / "forged", [keys[1], keys[1]])
    assert verify_run_dir(forged, keys=_pins(keys[:2])).keys_bound_by == "one key"
    pins = [a for k in range(2) for a in ("--pubkey", str(_one(tmp_path, keys[k], k)))]
    assert main(["verify", *pins, str(forged)]) == 0
    assert "2 keys are pinned; any one of them could have written a folder like this one" in capsys.readouterr().out
    roster = _roster_file(tmp_path / "roster", keys[:2])
    with pytest.raises(RosterMismatch, match=rf"rank 0: signed by key {keys[1].key_id}, but the roster .* binds "
                                             rf"key {keys[0].key_id} to rank 0"):
        verify_run_dir(forged, trust=TrustPolicy(roster=load_roster(roster)))
    assert main(["verify", "--roster", str(roster), str(forged)]) == 1
    assert f"binds key {keys[0].key_id} to rank 0" in capsys.readouterr().out
    honest = _folder(tmp_path / "honest", keys[:2])
    assert main(["verify", "--roster", str(roster), str(honest)]) == 0  # the roster's key lines pin the keys too
    assert f"keys bound to ranks by the roster {roster}" in capsys.readouterr().out


def test_a_folder_several_keys_sign_with_no_record_of_them_needs_a_roster(tmp_path, keys, capsys):
    run = _folder(tmp_path / "run", keys, rounds=0)  # no anchor yet: nothing binds a key to a rank
    with pytest.raises(RosterMismatch, match="signed by 4 keys and nothing binds rank 0.*--roster FILE"):
        verify_run_dir(run, keys=_pins(keys))
    roster = tmp_path / "roster"
    roster.write_text(f"0-1 {keys[0].key_id}\n2 {keys[2].key_id}\n* {keys[3].key_id}\n")
    with pytest.raises(RosterMismatch, match=rf"rank 1: signed by key {keys[1].key_id}, but the roster"):
        verify_run_dir(run, keys=_pins(keys), roster=load_roster(roster))
    roster.write_text(f"0 {keys[0].key_id}\n1 {keys[1].key_id}\n2-3 {keys[2].key_id}\n")
    with pytest.raises(RosterMismatch, match="rank 3"):
        verify_run_dir(run, keys=_pins(keys), roster=load_roster(roster))
    roster.write_text(f"0 {keys[0].key_id}\n1 {keys[1].key_id}\n2 {keys[2].key_id}\n")
    with pytest.raises(RosterMismatch, match="names no key for rank 3"):
        verify_run_dir(run, keys=_pins(keys), roster=load_roster(roster))
    roster.write_text(f"0 {keys[0].key_id}\n1 {keys[1].key_id}\n2 {keys[2].key_id}\n* {keys[3].key_id}\n")
    assert verify_run_dir(run, keys=_pins(keys), roster=load_roster(roster)).keys_bound_by == "roster"


def test_one_rank_journal_is_held_to_the_roster_too(tmp_path, keys, capsys):
    run = _folder(tmp_path / "run", keys[:2])
    roster = _roster_file(tmp_path / "roster", [keys[1], keys[0]])  # swapped
    assert main(["verify", "--roster", str(roster), str(run / "rank-00001.jsonl")]) == 1
    assert f"binds key {keys[0].key_id} to rank 1" in capsys.readouterr().out
    from trainledger.journal import Journal

    with Journal.create(tmp_path / "plain.jsonl", signer=keys[0], run_id="plain") as j:
        j.append(StepObserved(step=0, loss=1.0))
    assert main(["verify", "--roster", str(roster), str(tmp_path / "plain.jsonl")]) == 2
    assert "not a rank journal's" in capsys.readouterr().err


@pytest.mark.parametrize("text, says", [
    ("", "names no rank"),
    ("0\n", "expected 'RANKS KEY'"),
    ("0 notakey\n", "is not a key id"),
    ("x 0123456789abcdef\n", "is not a rank"),
    ("5-3 0123456789abcdef\n", "runs backwards"),
    ("0-4 0123456789abcdef\n4 0123456789abcdef\n", "ranks 4-4 are named twice"),
    ("* 0123456789abcdef\n* 0123456789abcdef\n", "a second '*'"),
    ("0 trainledger-ed25519 AAAA\n", "32 bytes"),
])
def test_a_bad_roster_is_refused_naming_its_line(tmp_path, text, says):
    with pytest.raises(KeyFileError, match=says):
        Roster.parse(text, "roster")


def test_a_roster_that_is_not_a_small_regular_file_is_refused(tmp_path, capsys):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_roster(fifo)
    run = _folder(tmp_path / "run", [Signer.generate()])
    assert main(["verify", "--roster", str(fifo), str(run)]) == 2
    assert "roster" in capsys.readouterr().err


def test_a_roster_of_16000_ranks_by_node_looks_up_each_rank(tmp_path):
    text = "".join(f"{8 * n}-{8 * n + 7} {n:016x}\n" for n in range(2000))
    roster = Roster.parse(text)
    assert roster.key_for(0) == f"{0:016x}" and roster.key_for(15999) == f"{1999:016x}"
    assert roster.key_for(8 * 1234 + 5) == f"{1234:016x}" and roster.key_for(16000) is None


def test_watch_holds_each_rank_to_the_roster_as_it_appears(tmp_path, keys):
    import io

    from trainledger.training.watch import watch

    run = _folder(tmp_path / "run", keys[:2])
    good = load_roster(_roster_file(tmp_path / "good", keys[:2]))
    assert watch(run, trust=TrustPolicy(roster=good), out=io.StringIO(), timeout=20, interval=0.05) == 0
    out = io.StringIO()
    swapped = load_roster(_roster_file(tmp_path / "swapped", [keys[1], keys[0]]))
    assert watch(run, trust=TrustPolicy(roster=swapped), out=out, timeout=20, interval=0.05) == 1
    assert f"binds key {keys[1].key_id} to rank 0" in out.getvalue()
