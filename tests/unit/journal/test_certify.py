"""Rank keys certified by one key (format 1.7, journal/certify.py): a journal signed by ephemeral keys verifies under
the certifying key alone, across a restart's new key; an uncertified key, a roster signed by another key, a seal of
another round's key, a certificate replayed from another round, another rank's certificate and an expired key each
fail, naming what is wrong; a run folder holds every rank of a round to one roster."""

from __future__ import annotations

import base64

import pytest

from trainledger.journal import Journal, Signer, StepObserved, verify
from trainledger.journal.audit.rundir import verify_run_dir
from trainledger.journal.certify import RankRoster, statement
from trainledger.journal.errors import IntegrityError, KeyFileError, RunMismatch, SealInvalid, UntrustedKey, UsageError
from trainledger.journal.kinds import RankJoined

from tests.helpers.compute_runs import anchor_ranks

RUN = "certrun"
OPTS = dict(background=False, seal_every=16)


def _rank_segment(j: Journal, rank: int, rnd: int, world: int, steps: range) -> None:
    j.append(RankJoined(run=RUN, rank=rank, world_size=world, local_rank=rank, node="n", restart_count=rnd,
                        versions={}), durable=True)
    for s in steps:
        j.append(StepObserved(step=s, loss=3.0 - 0.001 * s))


def write_folder(d, issuer: Signer, *, rounds: int = 2, world: int = 2, steps: int = 40,
                 close: bool = True, cosign: bool = True) -> list[tuple[RankRoster, list[Signer]]]:
    """A run folder as the ranks write it with ephemeral keys: every round new keys, one roster signed by
    ``issuer``, anchors at the end of each round."""
    d.mkdir(parents=True, exist_ok=True)
    made = []
    for rnd in range(rounds):
        keys = [Signer.generate() for _ in range(world)]
        roster = RankRoster.sign(issuer, run=RUN, round=rnd, keys=[k.public for k in keys])
        made.append((roster, keys))
        journals = []
        for r in range(world):
            key = keys[r]
            p = d / f"rank-{r:05d}.jsonl"
            if rnd == 0:
                j = Journal.create(p, signer=key, run_id=f"{RUN}.r{r:05d}", certificate=roster.certificate(r),
                                   meta={"run": RUN, "rank": r, "world_size": world}, **OPTS)
            else:
                j = Journal.open_append(p, signer=key, certificate=roster.certificate(r), **OPTS)
            _rank_segment(j, r, rnd, world, range(rnd * steps, (rnd + 1) * steps))
            journals.append(j)
        anchor_ranks(journals, issuer, RUN, steps, cosign=cosign)  # as the ranks' anchor_ranks records it
        for j in journals:
            j.close() if close and rnd == rounds - 1 else j.suspend()
    return made


def test_a_journal_of_ephemeral_keys_verifies_under_the_certifying_key_alone(tmp_path):
    issuer = Signer.generate()
    write_folder(tmp_path / "run", issuer)
    rep = verify(tmp_path / "run" / "rank-00001.jsonl", keys=[issuer.public], require_closed=True)
    assert rep.ok and rep.key_id == issuer.key_id and len(rep.signing_keys) == 2
    assert rep.kinds["key_certified"] == 2 and "certified by key " + issuer.key_id in rep.notes[0]
    folder = verify_run_dir(tmp_path / "run", keys=[issuer.public], require_closed=True)
    # two anchors a round, each holding the other rank and (countersigned) rank 0's own head, and one the other way
    assert folder.ok and folder.keys_bound_by == "certified" and folder.anchors == 6
    # the key it was signed with at first is not what a verifier pins
    with pytest.raises(UntrustedKey, match="certified by key " + issuer.key_id + ", which is not pinned"):
        verify(tmp_path / "run" / "rank-00000.jsonl", keys=[Signer.generate().public])


def test_a_roster_signed_by_another_key_fails_naming_the_rank(tmp_path):
    issuer, other = Signer.generate(), Signer.generate()
    write_folder(tmp_path / "good", issuer, rounds=1)
    write_folder(tmp_path / "forged", other, rounds=1)
    (tmp_path / "good" / "rank-00001.jsonl").write_bytes((tmp_path / "forged" / "rank-00001.jsonl").read_bytes())
    with pytest.raises(UntrustedKey, match=f"rank 1: .*certified by key {other.key_id}, which is not pinned"):
        verify_run_dir(tmp_path / "good", keys=[issuer.public])


def test_a_rank_signed_by_an_uncertified_key_fails_naming_the_rank(tmp_path):
    from journal_tools import read_lines, rechain, write_lines

    issuer = Signer.generate()
    write_folder(tmp_path / "run", issuer, rounds=1)
    p = tmp_path / "run" / "rank-00001.jsonl"
    write_lines(p, rechain(read_lines(p), resign=Signer.generate()))  # every seal re-signed by a key of its own
    with pytest.raises(SealInvalid, match="rank 1: seal at seq 2 is by key [0-9a-f]{16}, which no certificate"):
        verify_run_dir(tmp_path / "run", keys=[issuer.public])
    # a plain journal, signed by a key of its own, in a folder whose keys are certified
    other = Signer.generate()
    p.unlink()
    with Journal.create(p, signer=other, run_id=f"{RUN}.r00001", **OPTS) as j:
        _rank_segment(j, 1, 0, 2, range(40))
    with pytest.raises(UntrustedKey, match=f"rank 1: journal is signed by key {other.key_id}, which is not pinned"):
        verify_run_dir(tmp_path / "run", keys=[issuer.public])


def test_a_seal_of_the_previous_rounds_key_after_a_restart_fails(tmp_path):
    """A seal after round 1's certificate signed by round 0's key (one that leaked from a dead process's memory)."""
    from journal_tools import read_lines, rechain, write_lines

    issuer = Signer.generate()
    k0, k1 = Signer.generate(), Signer.generate()
    r0 = RankRoster.sign(issuer, run=RUN, round=0, keys=[k0.public])
    r1 = RankRoster.sign(issuer, run=RUN, round=1, keys=[k1.public])
    p = tmp_path / "rank-00000.jsonl"
    j = Journal.create(p, signer=k0, run_id=f"{RUN}.r00000", certificate=r0.certificate(0), **OPTS)
    _rank_segment(j, 0, 0, 1, range(20))
    j.suspend()
    j = Journal.open_append(p, signer=k1, certificate=r1.certificate(0), **OPTS)
    _rank_segment(j, 0, 1, 1, range(20, 40))
    j.close()
    assert verify(p, keys=[issuer.public]).ok
    # the attacker holds k0 only: every seal signed by it (round 0's come out the same bytes: Ed25519 is
    # deterministic), round 1's too
    write_lines(p, rechain(read_lines(p), resign=k0))
    with pytest.raises(SealInvalid, match="by key " + k0.key_id + ", but the key certified last before it is "
                                          + k1.key_id):
        verify(p, keys=[issuer.public])


def test_a_certificate_of_another_round_or_rank_fails(tmp_path):
    issuer = Signer.generate()
    keys = [Signer.generate() for _ in range(2)]
    r0 = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public for k in keys])
    # another rank's certificate: the writer refuses it, and so does the verifier
    with pytest.raises(UsageError, match="another key than the signer's"):
        Journal.create(tmp_path / "x.jsonl", signer=keys[1], run_id=f"{RUN}.r00001", certificate=r0.certificate(0))
    # a round replayed: round 0's roster again after a restart (new keys, signed again for round 0)
    p = tmp_path / "rank-00000.jsonl"
    j = Journal.create(p, signer=keys[0], run_id=f"{RUN}.r00000", certificate=r0.certificate(0), **OPTS)
    _rank_segment(j, 0, 0, 2, range(10))
    j.suspend()
    again = [Signer.generate() for _ in range(2)]
    stale = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public for k in again])
    j = Journal.open_append(p, signer=again[0], certificate=stale.certificate(0), **OPTS)
    _rank_segment(j, 0, 1, 2, range(10, 20))
    j.close()
    with pytest.raises(SealInvalid, match="certifies round 0 after round 0: a certificate replayed"):
        verify(p, keys=[issuer.public])


def test_a_rank_that_joined_a_round_under_another_rounds_roster_fails(tmp_path):
    """Rank 1 restarted into round 1 but certified by a roster of round 2 (not the one rank 0 holds for round 1):
    the folder check names rank 1 and the round."""
    issuer = Signer.generate()
    write_folder(tmp_path / "run", issuer, rounds=1, close=False)
    k = [Signer.generate() for _ in range(2)]
    for r in (0, 1):
        roster = RankRoster.sign(issuer, run=RUN, round=2 if r == 1 else 1, keys=[x.public for x in k])
        j = Journal.open_append(tmp_path / "run" / f"rank-{r:05d}.jsonl", signer=k[r], certificate=roster.certificate(r),
                                **OPTS)
        _rank_segment(j, r, 1, 2, range(40, 50))
        j.close()
    with pytest.raises(IntegrityError, match="rank 1: joined restart round 1 at seq [0-9]+ under round 2's key: a rank "
                                             "from another round"):
        verify_run_dir(tmp_path / "run", keys=[issuer.public])


def test_two_rosters_for_one_round_fail_naming_the_rank(tmp_path):
    issuer = Signer.generate()
    d = tmp_path / "run"
    keys = [Signer.generate() for _ in range(2)]
    a = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public for k in keys])
    b = RankRoster.sign(issuer, run=RUN, round=0, keys=[keys[0].public, keys[1].public])  # issued later: another one
    for r, roster in ((0, a), (1, b)):
        with Journal.create(d / f"rank-{r:05d}.jsonl", signer=keys[r], run_id=f"{RUN}.r{r:05d}",
                            certificate=roster.certificate(r), **OPTS) as j:
            _rank_segment(j, r, 0, 2, range(10))
    with pytest.raises(IntegrityError, match="rank 1: its certificate for round 0 .* is not the roster rank 0 "
                                             "recorded for that round"):
        verify_run_dir(d, keys=[issuer.public])


def test_a_tampered_certificate_and_an_expired_key_fail(tmp_path):
    from journal_tools import dump, read_lines, rechain, write_lines
    import msgspec

    issuer = Signer.generate()
    k = Signer.generate()
    short = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public], validity_s=1e-9)
    p = tmp_path / "rank-00000.jsonl"
    with Journal.create(p, signer=k, run_id=f"{RUN}.r00000", certificate=short.certificate(0), **OPTS) as j:
        _rank_segment(j, 0, 0, 1, range(5))
    with pytest.raises(SealInvalid, match="dated after its key .* stopped being valid"):
        verify(p, keys=[issuer.public])
    # a certificate whose statement was edited (a longer validity) no longer carries the issuer's signature
    good = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public])
    q = tmp_path / "q" / "rank-00000.jsonl"
    with Journal.create(q, signer=k, run_id=f"{RUN}.r00000", certificate=good.certificate(0), **OPTS) as j:
        _rank_segment(j, 0, 0, 1, range(5))
    lines = read_lines(q)
    cert = msgspec.json.decode(lines[1])
    cert["not_after_ns"] += 10**18
    write_lines(q, rechain([lines[0], dump(cert)] + lines[2:], resign=k))
    with pytest.raises(SealInvalid, match="key_certified at seq 1: the roster's signature does not verify"):
        verify(q, keys=[issuer.public])
    # the statement is what the docs say, byte for byte
    assert statement("r", 1, 2, "ab" * 32, 5, 6) == (b"trainledger/v1/rank-keys\nrun r\nround 1\nworld 2\nkeys "
                                                     + b"ab" * 32 + b"\nissued 5\nnot-after 6\n")


def test_a_certified_journal_verifies_in_parallel_ranges_and_reads_without_keys(tmp_path):
    """Large enough for worker processes: the ranges' first seals are held to the key certified before them."""
    from trainledger.journal import read_events

    issuer = Signer.generate()
    k0, k1 = Signer.generate(), Signer.generate()
    p = tmp_path / "rank-00000.jsonl"
    j = Journal.create(p, signer=k0, run_id=f"{RUN}.r00000",
                       certificate=RankRoster.sign(issuer, run=RUN, round=0, keys=[k0.public]).certificate(0),
                       background=False)
    pad = "x" * 150
    for i in range(70_000):
        j.append(RunResumedLike(pad))
    j.suspend()
    j = Journal.open_append(p, signer=k1, background=False,
                            certificate=RankRoster.sign(issuer, run=RUN, round=1, keys=[k1.public]).certificate(0))
    for i in range(70_000):
        j.append(RunResumedLike(pad))
    j.close()
    assert p.stat().st_size > 24 << 20
    rep = verify(p, keys=[issuer.public], workers=4, require_closed=True)
    assert rep.ok and rep.signing_keys == [k0.key_id, k1.key_id]
    assert sum(1 for _ in read_events(p)) == rep.events


def RunResumedLike(pad: str):
    from trainledger.journal import RunResumed

    return RunResumed(reason=pad)


def test_the_leaf_and_the_proof_are_bound_to_the_rank(tmp_path, monkeypatch):
    issuer = Signer.generate()
    keys = [Signer.generate() for _ in range(5)]
    roster = RankRoster.sign(issuer, run=RUN, round=0, keys=[k.public for k in keys])
    c3 = roster.certificate(3)
    assert c3.key == keys[3].public.b64 and len(c3.proof) == 3 and c3.keys_root == roster.keys_root
    assert base64.b64decode(c3.issuer) == issuer.public.raw
    # rank 3's certificate in rank 2's journal: the writer refuses another rank's; the verifier another run's
    with pytest.raises(UsageError, match="rank 3 of run 'certrun', not rank 2"):
        Journal.create(tmp_path / "j.jsonl", signer=keys[3], run_id=f"{RUN}.r00002", certificate=c3)
    with pytest.raises(UsageError, match="not rank 3 of 'other'"):
        Journal.create(tmp_path / "k.jsonl", signer=keys[3], run_id="other.r00003", certificate=c3)
    # a writer that skipped its own check: the verifier names the run and rank the certificate is for
    from trainledger.journal import writer

    monkeypatch.setattr(writer, "_check_certificate_use", lambda *a: None)
    with Journal.create(tmp_path / "m.jsonl", signer=keys[3], run_id=f"{RUN}.r00002", certificate=c3, **OPTS) as j:
        j.append(StepObserved(step=0, loss=1.0))
    with pytest.raises(RunMismatch, match="certifies a key for rank 3 of run 'certrun', not rank 2 of 'certrun'"):
        verify(tmp_path / "m.jsonl", keys=[issuer.public])


def test_rank_0s_anchors_are_countersigned_by_the_certifying_key(tmp_path):
    """Each anchor rank 0 records is signed by the run key too (one signature an anchor), so the anchored history
    of every rank, rank 0's own included, rests on the pinned key: an anchor without the countersignature, or with
    one over other heads, fails naming rank 0."""
    import msgspec
    from journal_tools import dump, read_lines, rechain, write_lines

    issuer = Signer.generate()
    write_folder(tmp_path / "bare", issuer, rounds=1, cosign=False)
    with pytest.raises(IntegrityError, match="rank 0: the anchor at its seq [0-9]+ is not countersigned"):
        verify_run_dir(tmp_path / "bare", keys=[issuer.public])
    (_, keys), = write_folder(tmp_path / "run", issuer, rounds=1)
    assert verify_run_dir(tmp_path / "run", keys=[issuer.public]).ok
    # whoever took rank 0's own key from its memory rewrites its anchor and re-signs its seals: the run key's
    # countersignature no longer fits
    p = tmp_path / "run" / "rank-00000.jsonl"
    lines = read_lines(p)
    at = next(i for i, ln in enumerate(lines) if b'"kind":"ranks_anchored"' in ln)
    ev = msgspec.json.decode(lines[at])
    ev["step"] = 41
    write_lines(p, rechain(lines[:at] + [dump(ev)] + lines[at + 1:], resign=keys[0]))
    assert verify(p, keys=[issuer.public]).ok  # the journal alone checks out: it is signed by rank 0's key
    with pytest.raises(IntegrityError, match="rank 0: the countersignature of the anchor at its seq [0-9]+ does not "
                                             "verify"):
        verify_run_dir(tmp_path / "run", keys=[issuer.public])


def test_a_bundle_of_a_certified_journal_carries_the_certificate(tmp_path):
    """prove on a rank journal signed by certified keys: the bundle names the seal's rank key and carries its
    certificate line, proven in the same tree; verify-proof accepts it with only the run key pinned, and refuses it
    under another key, with the certificate dropped, or with another rank's certificate."""
    import json

    from trainledger.journal import proofs as T
    from trainledger.journal.errors import IntegrityError

    issuer = Signer.generate()
    (roster, keys), _ = write_folder(tmp_path / "run", issuer, rounds=2)
    p = tmp_path / "run" / "rank-00001.jsonl"
    res = T.prove(p, [5], keys=[issuer.public])
    b = res.bundle
    assert b["key_id"] != issuer.key_id and b["certificate"]["line"].startswith('{"kind":"key_certified",')
    r = T.verify_bundle(json.dumps(b).encode(), [issuer.public])
    assert [e.seq for e in r.events] == [5]
    with pytest.raises(UntrustedKey, match="certified by key .* which is not pinned"):
        T.verify_bundle(json.dumps(b).encode(), [Signer.generate().public])
    bare = {k: v for k, v in b.items() if k != "certificate"}
    with pytest.raises(UntrustedKey, match="not pinned"):
        T.verify_bundle(json.dumps(bare).encode(), [issuer.public])
    other = T.prove(tmp_path / "run" / "rank-00000.jsonl", [5], keys=[issuer.public]).bundle
    swapped = {**b, "certificate": other["certificate"]}
    with pytest.raises(IntegrityError, match="certifies a key for rank 0 .* not rank 1"):
        T.verify_bundle(json.dumps(swapped).encode(), [issuer.public])
    forged = json.loads(json.dumps(b))
    forged["certificate"]["proof"] = forged["certificate"]["proof"][::-1]
    from trainledger.journal.merkle import ProofError

    with pytest.raises(ProofError, match=r"the certificate \(seq [0-9]+\): the proof leads to another root"):
        T.verify_bundle(json.dumps(forged).encode(), [issuer.public])


def test_only_rank_0_holds_the_run_key_under_torchrun(monkeypatch, tmp_path):
    """The Recorder and the callbacks on a rank other than 0, with the run key in a token or a service and rank keys
    certified by it, open no token session: a stand-in learns the public key from the rank's certificate. Rank 0, a
    key file, rank_keys='key' and continue_from load the key itself."""
    from trainledger.training.integrations.hooks import learn_run_key, run_key_for_rank

    uri = "pkcs11:token=t;object=run?module-path=/nonexistent.so"  # never opened on rank 1
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    stand_in = run_key_for_rank(uri, None)
    with pytest.raises(UsageError, match="signs on rank 0 only"):
        stand_in.sign(b"x")
    issuer = Signer.generate()
    k = Signer.generate()
    roster = RankRoster.sign(issuer, run=RUN, round=0, keys=[Signer.generate().public, k.public])
    j = Journal.create(tmp_path / "rank-00001.jsonl", signer=k, run_id=f"{RUN}.r00001", certificate=roster.certificate(1))
    learn_run_key(stand_in, j)
    assert stand_in.public.key_id == issuer.key_id
    j.close()
    for kw in ({"rank_keys": "key"}, {"continue_from": "prev"}):
        with pytest.raises((UsageError, KeyFileError), match="module is not there|python-pkcs11"):
            run_key_for_rank(uri, None, **kw)  # loads (and here fails: no such module)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises((UsageError, KeyFileError), match="module is not there|python-pkcs11"):
        run_key_for_rank(uri, None)


def test_watch_follows_a_certified_journal_across_a_restart(tmp_path):
    """The one follower (journal.follow, which watch and serve use) reads a rank journal's certificates when it
    starts; a restart while it follows adds a round's certificate, which it reads and checks then (under the same
    pinned key), holding the new key's seals to it: not a false FAIL. watch then sees the run closed."""
    import io

    from trainledger.journal.follow import Follower
    from trainledger.training.watch import watch

    issuer = Signer.generate()
    k0, k1 = Signer.generate(), Signer.generate()
    p = tmp_path / "rank-00000.jsonl"
    j = Journal.create(p, signer=k0, run_id=f"{RUN}.r00000",
                       certificate=RankRoster.sign(issuer, run=RUN, round=0, keys=[k0.public]).certificate(0), **OPTS)
    _rank_segment(j, 0, 0, 1, range(20))
    j.suspend()
    follower = Follower(p, keys=[issuer.public])
    seen: list = []
    assert not follower.read_new(lambda recs, at: seen.extend(recs))
    j = Journal.open_append(p, signer=k1, **OPTS,
                            certificate=RankRoster.sign(issuer, run=RUN, round=1, keys=[k1.public]).certificate(0))
    _rank_segment(j, 0, 1, 1, range(20, 40))
    j.close()
    assert not follower.read_new(lambda recs, at: seen.extend(recs))
    assert type(seen[-1]).__struct_config__.tag == "seal" and type(seen[-2]).__struct_config__.tag == "run_closed"
    assert follower.last_seal_seq == seen[-1].seq and follower.trust == "pinned"
    assert watch(p, keys=[issuer.public], out=io.StringIO(), timeout=60) == 0
