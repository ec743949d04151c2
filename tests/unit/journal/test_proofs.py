"""Proving one fact without sharing the run. Bundles (prove / verify-proof), checkpoints, consistency,
the tree index, witnesses and their quorum, and the training compute as one provable figure."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from conftest import step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_tools import dump, parse, read_lines, rechain, write_lines
from test_cli import run

from trainledger.journal import Journal, Signer
from trainledger.journal import proofs as T

from trainledger.journal.proofs import index as tree_index
from trainledger.journal.errors import CheckpointMismatch, IntegrityError, UntrustedKey, UsageError
from trainledger.training.kinds import ComputeTotaled, RunConfigured
from trainledger.journal.merkle import ProofError, consistency_proof, inclusion_proof, leaf_hash
from trainledger.training.health.mfu import record_compute
from trainledger.journal.note import NoteError, cosign, cosigner_key, parse_verifier_key
from trainledger.audit import replay

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


def _journal(path: Path, signer: Signer, n: int, *, run_id: str = "proof-run", start: int = 0, loss: float = 1.0,
             close: bool = True, seal_every: int = 100) -> Path:
    j = Journal.create(path, signer=signer, run_id=run_id, background=False, seal_every=seal_every)
    for i in range(start, start + n):
        j.append(step(i, loss=loss))
    j.close() if close else j.suspend()
    return path


def _grow(path: Path, signer: Signer, n: int, start: int) -> None:
    """Continue the run with ``n`` more steps; it stays open (suspended), as a live run's journal is."""
    j = Journal.open_append(path, signer=signer, background=False)
    for i in range(start, start + n):
        j.append(step(i))
    j.suspend()


@pytest.fixture
def proven(tmp_path, signer, pubkey):
    """A closed journal of 2,600 steps (three tiles and a partial one) and a bundle for three of its lines."""
    p = _journal(tmp_path / "j.jsonl", signer, 2600)
    res = T.prove(p, [0, 1500, 2599], keys=[pubkey])
    return p, res.bundle


def _bytes(bundle: dict) -> bytes:
    return json.dumps(bundle).encode()


def test_a_bundle_proves_its_lines_against_the_signed_checkpoint(proven, pubkey):
    p, b = proven
    lines = read_lines(p)
    r = T.verify_bundle(_bytes(b), [pubkey])
    assert r.tree_size == len(lines) - 1  # the closing seal's tree: every line before it
    assert [e.seq for e in r.events] == [0, 1500, 2599]
    assert [e["line"].encode() for e in b["entries"]] == [lines[0], lines[1500], lines[2599]]
    assert all(len(e["proof"]) <= (r.tree_size - 1).bit_length() for e in b["entries"])  # <= ceil(log2 n)
    assert b["checkpoint"].startswith(f"trainledger/proof-run\n{r.tree_size}\n")


def _mutations(b: dict, other_run: dict, other_key: Signer) -> dict:
    def entry(f):
        c = json.loads(json.dumps(b))
        f(c)
        return c

    def flip_line(c):
        line = c["entries"][1]["line"]
        c["entries"][1]["line"] = line.replace('"loss":1.0', '"loss":1.5')

    def forged_checkpoint(c):  # another root, signed by a key that is not the run's
        text = c["checkpoint"][:c["checkpoint"].rfind("\n\n") + 1]
        lines = text.split("\n")
        lines[2] = base64.b64encode(b"\x07" * 32).decode()
        text = "\n".join(lines)
        from trainledger.journal.note import note_signature_line

        c["checkpoint"] = text + "\n" + note_signature_line("trainledger/proof-run", other_key.public.raw,
                                                            other_key.sign(text.encode()))

    def changed_size(c):
        lines = c["checkpoint"].split("\n")
        lines[1] = str(int(lines[1]) + 1)
        c["checkpoint"] = "\n".join(lines)

    def dropped_hash(c):
        c["entries"][1]["proof"] = c["entries"][1]["proof"][:-1]

    def bit_flip(c):
        h = bytearray(base64.b64decode(c["entries"][1]["proof"][0]))
        h[0] ^= 1
        c["entries"][1]["proof"][0] = base64.b64encode(bytes(h)).decode()

    return {
        "wrong index": (entry(lambda c: c["entries"][1].update(seq=1501)), "says seq 1500|leads to another root"),
        "a line changed by one byte": (entry(flip_line), "another root"),
        "a proof from another run": (entry(lambda c: c["entries"].__setitem__(1, other_run["entries"][0])),
                                     "another root"),
        "a checkpoint signed by another key": (entry(forged_checkpoint), "not signed by a pinned key"),
        "a size changed under the signature": (entry(changed_size), "does not verify|trainledger-head"),
        "a proof hash dropped": (entry(dropped_hash), "shorter than the tree is deep"),
        "a proof hash with one bit flipped": (entry(bit_flip), "another root"),
        "a seq beyond the tree": (entry(lambda c: c["entries"][1].update(seq=10**9)), "outside the checkpoint"),
        "an unknown member": (entry(lambda c: c.update(extra=1)), "not a proof bundle"),
        "no entries": (entry(lambda c: c.update(entries=[])), "proves nothing"),
    }


def test_adversarial_bundles_are_refused_each_with_its_reason(proven, pubkey, tmp_path):
    p, b = proven
    other_key = Signer.generate()
    q = _journal(tmp_path / "other.jsonl", other_key, 2600, run_id="other-run", loss=2.0)
    other = T.prove(q, [1500], keys=[other_key.public]).bundle
    import re

    for what, (bad, says) in _mutations(b, other, other_key).items():
        with pytest.raises((IntegrityError, ProofError, NoteError)) as ei:
            T.verify_bundle(_bytes(bad), [pubkey])
        assert re.search(says, str(ei.value)), (what, str(ei.value))
    with pytest.raises(UntrustedKey, match="not pinned"):
        T.verify_bundle(_bytes(b), [other_key.public])
    with pytest.raises(UsageError, match="no key pinned"):
        T.verify_bundle(_bytes(b), [])


def test_cli_prove_and_verify_proof_exit_codes(proven, pubkey, tmp_path, capsys, keypair):
    p, b = proven
    pub = keypair[2]
    out = tmp_path / "b.json"
    code, text, _ = run(capsys, "prove", p, "--seq", 7, "--seq", 2000, "-o", out, "--pubkey", pub)
    assert code == 0 and "2 line(s)" in text
    code, text, _ = run(capsys, "verify-proof", out, "--pubkey", pub, "--json")
    d = json.loads(text)
    assert code == 0 and d["ok"] and [e["seq"] for e in d["entries"]] == [7, 2000]
    bad = json.loads(out.read_text())
    bad["entries"][0]["line"] = bad["entries"][0]["line"].replace("4096", "4097")
    out.write_text(json.dumps(bad))
    code, text, _ = run(capsys, "verify-proof", out, "--pubkey", pub)
    assert code == 1 and text.startswith("FAIL") and len(text.splitlines()) == 1
    out.write_text("{not json")
    code, text, _ = run(capsys, "verify-proof", out, "--pubkey", pub)
    assert code == 1 and "not a proof bundle" in text
    code, _, err = run(capsys, "verify-proof", tmp_path / "missing.json", "--pubkey", pub)
    assert code == 2 and "missing.json" in err
    code, _, err = run(capsys, "prove", p, "--seq", 10**7, "-o", out, "--pubkey", pub)
    assert code == 2 and "is not in the tree" in err


def test_a_stale_or_doctored_index_is_rebuilt_never_trusted(tmp_path, signer, pubkey, monkeypatch):
    p = _journal(tmp_path / "j.jsonl", signer, 3000)
    first = T.prove(p, [2100], keys=[pubkey])
    assert first.index_built and first.index_saved and T.index_path_for(p).exists()
    again = T.prove(p, [2100], keys=[pubkey])
    assert not again.index_built and again.bundle == first.bundle
    # Doctor a stored tile root: the tile read for the proof no longer matches it; the index is rebuilt.
    idx = T.load_index(p)
    idx.levels[0] = b"\x00" * 32 + idx.levels[0][32:]
    T.save_index(idx, T.index_path_for(p))
    healed = T.prove(p, [5], keys=[pubkey])
    assert healed.index_built and T.verify_bundle(_bytes(healed.bundle), [pubkey]).events[0].seq == 5
    # A tile too large to read at once (here: a cap of 4 KiB): a sidecar's word for it is not taken (the index is
    # built again first), and then it is said in one line, not a traceback or an exhausted memory.
    monkeypatch.setattr(tree_index, "_MAX_TILE_BYTES", 4096)
    with pytest.raises(UsageError, match="more than the 4,096 a proof reads at once"):
        T.prove(p, [5], keys=[pubkey])
    monkeypatch.undo()
    # Garbage in the sidecar is no index at all.
    T.index_path_for(p).write_bytes(b"trainledger-tree-index/v1\n{}\n")
    assert T.load_index(p) is None
    assert T.prove(p, [5], keys=[pubkey]).index_built


def test_a_journal_changed_after_its_seal_yields_no_bundle(tmp_path, signer, pubkey):
    p = _journal(tmp_path / "j.jsonl", signer, 1500)
    lines = read_lines(p)
    obj = parse(lines[700])
    obj["loss"] = 9.0
    lines[700] = dump(obj)
    write_lines(p, rechain(lines, fix_seal_heads=False))  # an attacker without the key: the seals are stale
    with pytest.raises(IntegrityError, match="do not hash to the tree its seal signed"):
        T.prove(p, [700], keys=[pubkey])


def test_the_index_grows_with_the_journal_and_parallel_build_agrees(tmp_path, signer, pubkey, monkeypatch):
    p = _journal(tmp_path / "j.jsonl", signer, 2500, close=False)
    T.prove(p, [10], keys=[pubkey])
    _grow(p, signer, 3000, 2500)
    res = T.prove(p, [5000], keys=[pubkey])
    assert res.index_built  # extended: the old index was shorter than the new checkpoint
    lines = read_lines(p)
    whole = T.build_index(p, workers=1)
    monkeypatch.setattr(tree_index, "_PARALLEL_INDEX_BYTES", 1 << 10)
    par = T.build_index(p, workers=2)
    grown = T.load_index(p)
    assert whole == par
    assert (grown.leaves, grown.offsets, grown.levels) == (whole.leaves, whole.offsets, whole.levels)
    assert whole.leaves == len(lines)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 3100), data=st.data())
def test_tree_view_proofs_equal_the_reference(tmp_path_factory, n, data):
    """Proofs from the index and the journal's tiles are byte for byte those of the reference over every leaf."""
    d = tmp_path_factory.mktemp("tv")
    p = d / "j.jsonl"
    p.write_bytes(_LINES_BLOB)
    idx = T.build_index(p, workers=1)
    leaves = [leaf_hash(x) for x in _LINES[:n]]
    view = T.TreeView(p, idx, n)
    for i in data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4)):
        assert view.inclusion(i) == inclusion_proof(leaves, i)
    for m in data.draw(st.lists(st.integers(1, n), min_size=1, max_size=4)):
        assert view.consistency(m) == consistency_proof(leaves, m)


def _blob() -> tuple[list[bytes], bytes]:
    import tempfile

    s = Signer.generate()
    with tempfile.TemporaryDirectory() as d:
        p = _journal(Path(d) / "j.jsonl", s, 3200, seal_every=97)
        data = p.read_bytes()
    return data[:-1].split(b"\n"), data


_LINES, _LINES_BLOB = _blob()


def test_verify_expect_checkpoint_passes_a_grown_journal_and_names_a_fork_or_truncation(tmp_path, signer, keypair,
                                                                                        capsys):
    pub = keypair[2]
    p = _journal(tmp_path / "j.jsonl", signer, 800, close=False)
    code, note, _ = run(capsys, "tree-head", p, "--pubkey", pub)
    assert code == 0
    code, again, err = run(capsys, "checkpoint", p, "--pubkey", pub)  # the old name: the same note, and a line
    assert code == 0 and again == note and err.count("\n") == 1
    assert "trainledger checkpoint is deprecated and goes away in 0.3: use trainledger tree-head" in err
    (tmp_path / "old.note").write_text(note)
    _grow(p, signer, 4000, 800)
    code, text, _ = run(capsys, "verify", p, "--pubkey", pub, "--expect-checkpoint", tmp_path / "old.note")
    assert code == 0 and "extends the expected checkpoint" in text
    size = len(read_lines(p)) - 1  # the last line is a seal (the run was suspended): its tree is every line before it
    assert f"  tree      {size:,} lines, root " in text
    # The writer (holding the key) rewrites history: a fork of the same run, signed and self-consistent.
    f = _journal(tmp_path / "fork.jsonl", signer, 4800, loss=1.25, run_id=parse(read_lines(p)[0])["run_id"])
    code, text, _ = run(capsys, "verify", f, "--pubkey", pub, "--expect-checkpoint", tmp_path / "old.note")
    assert code == 1 and "rewritten since it was published" in text
    # Truncated below the checkpoint.
    short = tmp_path / "short.jsonl"
    shutil.copy(p, short)
    lines = read_lines(short)
    cut = max(i for i, x in enumerate(lines[:500]) if parse(x)["kind"] == "seal")
    write_lines(short, lines[:cut + 1])
    code, text, _ = run(capsys, "verify", short, "--pubkey", pub, "--expect-checkpoint", tmp_path / "old.note")
    assert code == 1 and f"the journal holds {cut + 1:,}: truncated" in text
    # A checkpoint note not signed by the pinned key.
    forged = note.replace(note.split("\n")[2], base64.b64encode(b"\x01" * 32).decode())
    (tmp_path / "forged.note").write_text(forged)
    code, text, _ = run(capsys, "verify", p, "--pubkey", pub, "--expect-checkpoint", tmp_path / "forged.note")
    assert code == 1 and "does not verify" in text


def test_consistency_bundle_for_a_third_party(tmp_path, signer, pubkey):
    p = _journal(tmp_path / "j.jsonl", signer, 1000, close=False)
    old = T.prove(p, [3], keys=[pubkey]).bundle["checkpoint"]
    size = int(old.split("\n")[1])
    _grow(p, signer, 2000, 1000)
    c = T.consistency(p, size, keys=[pubkey]).bundle
    r = T.verify_bundle(_bytes(c), [pubkey], expect_checkpoint=old)
    assert r.consistent_from == size and r.tree_size > size
    bad = json.loads(json.dumps(c))
    bad["consistency"]["from_root"] = base64.b64encode(b"\x02" * 32).decode()
    with pytest.raises(ProofError, match="old root"):
        T.verify_bundle(_bytes(bad), [pubkey])
    with pytest.raises(CheckpointMismatch, match="not from the expected checkpoint"):
        T.verify_bundle(_bytes(T.consistency(p, size - 1, keys=[pubkey]).bundle), [pubkey], expect_checkpoint=old)


def test_a_witness_cosigns_growth_and_refuses_a_rollback_and_a_fork(tmp_path, signer, pubkey):
    w_key = Signer.generate()
    w = T.Witness(tmp_path / "state.json", "w1", w_key._key)
    vkey = parse_verifier_key(cosigner_key("w1", w_key.public.raw))
    p = _journal(tmp_path / "j.jsonl", signer, 600, close=False)
    first = T.prove(p, [1], keys=[pubkey]).bundle
    size = int(first["checkpoint"].split("\n")[1])
    _, note = w.add(_bytes(first), [pubkey], now=1_800_000_000)
    cos = dict(first, checkpoint=note)
    assert T.verify_bundle(_bytes(cos), [pubkey], witnesses=[vkey], quorum=1).witnesses == [("w1", 1_800_000_000)]
    _grow(p, signer, 900, 600)
    grown = T.consistency(p, size, keys=[pubkey]).bundle
    w.add(_bytes(grown), [pubkey])
    with pytest.raises(T.WitnessRefused, match="rollback"):
        w.add(_bytes(first), [pubkey])
    w.add(_bytes(grown), [pubkey])  # the same checkpoint again: nothing changed, cosigned again
    _grow(p, signer, 100, 1500)
    with pytest.raises(T.WitnessRefused, match="no consistency proof from size"):
        w.add(_bytes(T.prove(p, [2], keys=[pubkey]).bundle), [pubkey])  # growth without a proof
    # The key holder forks the run: same run id and size as the cosigned checkpoint, other lines.
    rid = parse(read_lines(p)[0])["run_id"]
    state = json.loads((tmp_path / "state.json").read_text())
    n = state[f"trainledger/{rid}"]["size"]
    f = tmp_path / "fork.jsonl"
    _journal(f, signer, 10, run_id=rid, close=False)
    _grow(f, signer, 5000, 10)
    fork_bundle = T.consistency(f, n, keys=[pubkey]).bundle
    with pytest.raises(T.WitnessRefused, match="fork: the checkpoint is not an extension"):
        w.add(_bytes(fork_bundle), [pubkey])


def test_a_witness_refuses_a_fork_at_the_same_size(tmp_path, signer, pubkey):
    w = T.Witness(tmp_path / "state.json", "w1", Signer.generate()._key)
    a = _journal(tmp_path / "a.jsonl", signer, 50, run_id="twin")
    b = _journal(tmp_path / "b.jsonl", signer, 50, run_id="twin", loss=3.0)
    w.add(_bytes(T.prove(a, [1], keys=[pubkey]).bundle), [pubkey])
    with pytest.raises(T.WitnessRefused, match="fork: trainledger/twin at size"):
        w.add(_bytes(T.prove(b, [1], keys=[pubkey]).bundle), [pubkey])


def test_quorum_counts_only_pinned_witnesses_with_valid_cosignatures(proven, pubkey):
    _, b = proven
    text = b["checkpoint"][:b["checkpoint"].rfind("\n\n") + 1]
    w1, w2, stranger = Signer.generate(), Signer.generate(), Signer.generate()
    v1 = parse_verifier_key(cosigner_key("w1", w1.public.raw))
    v2 = parse_verifier_key(cosigner_key("w2", w2.public.raw))
    note = b["checkpoint"] + cosign(text, "w1", w1._key, 1) + cosign(text, "stranger", stranger._key, 2)
    with_cos = _bytes(dict(b, checkpoint=note))
    assert len(T.verify_bundle(with_cos, [pubkey], witnesses=[v1, v2], quorum=1).witnesses) == 1
    with pytest.raises(NoteError, match="fewer than the quorum of 2"):
        T.verify_bundle(with_cos, [pubkey], witnesses=[v1, v2], quorum=2)
    # A pinned witness's name on a cosignature it did not make rejects the note.
    fake = cosign(text, "w2", stranger._key, 3)
    with pytest.raises(NoteError):
        T.verify_bundle(_bytes(dict(b, checkpoint=b["checkpoint"] + fake)), [pubkey], witnesses=[v1, v2], quorum=1)


def test_the_training_compute_is_one_provable_figure_and_replay_recomputes_it(tmp_path, signer, pubkey, keypair,
                                                                             capsys):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    j.append(RunConfigured(n_params=1000, n_layer=2, n_head=2, head_dim=8, seq_len=16))
    for i in range(40):
        j.append(step(i, tokens=64))
    j.append(RunConfigured())  # a segment with no FLOP shape
    for i in range(40, 50):
        j.append(step(i, tokens=32))
    ev = record_compute(j)
    j.close()
    fpt = 6 * 1000 + 12 * 2 * 2 * 8 * 16
    assert (ev.steps, ev.tokens, ev.flops, ev.tokens_without_shape) == (50, 40 * 64 + 320, float(fpt * 40 * 64), 320)
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.compute["flops"] == ev.flops and rec.compute["steps"] == 50
    from trainledger.report import write_report

    write_report(p, tmp_path / "r.html", keys=[pubkey])
    assert f"{50:,} steps, {ev.tokens:,} tokens, {ev.flops:.4g} model FLOPs" in (tmp_path / "r.html").read_text()
    code, text, _ = run(capsys, "prove", p, "--compute", "-o", tmp_path / "c.json", "--pubkey", keypair[2])
    assert code == 0
    r = T.verify_bundle((tmp_path / "c.json").read_bytes(), [pubkey])
    [total] = [e for e in r.events if isinstance(e, ComputeTotaled)]
    assert total.flops == ev.flops and type(r.events[-1]).__struct_config__.tag == "run_closed"  # shown the last
    configs = [e for e in r.events if isinstance(e, RunConfigured)]
    assert len(configs) == 1 and configs[0].n_params is None  # the segment before it
    # The writer's key signs an inflated figure: replay names it.
    lines = read_lines(p)
    i = next(k for k, x in enumerate(lines) if b'"compute_totaled"' in x)
    obj = parse(lines[i])
    obj["flops"] *= 10
    lines[i] = dump(obj)
    write_lines(p, rechain(lines, resign=signer))
    diffs = replay(p, keys=[pubkey]).differences
    assert [d["kind"] for d in diffs] == ["compute_totaled"] and "recorded flops" in diffs[0]["detail"]


def test_prove_helpers_on_the_golden_journal(tmp_path, capsys):
    src = GOLDEN / "every_kind_v1_3.jsonl"
    p = tmp_path / src.name
    shutil.copy(src, p)
    pub = GOLDEN / "every_kind_v1_3.pub"
    out = tmp_path / "g.json"
    code, text, err = run(capsys, "prove", p, "--gate", "rung_i", "--checkpoint", "19", "--compute", "-o", out,
                          "--pubkey", pub)
    assert code == 0, err
    code, text, _ = run(capsys, "verify-proof", out, "--pubkey", pub, "--json")
    kinds = [e["kind"] for e in json.loads(text)["entries"]]
    assert code == 0
    assert {"checkpoint_saved", "gate_verdict", "decision_recorded", "rung_started", "compute_totaled",
            "run_configured"} <= set(kinds)
    assert not (GOLDEN / "every_kind_v1_3.jsonl.tlindex").exists()
    code, _, err = run(capsys, "prove", p, "--gate", "no-such-rung", "-o", out, "--pubkey", pub)
    assert code == 2 and "no gate_verdict for rung" in err


def test_older_formats_have_no_checkpoints_to_prove(tmp_path, capsys):
    src = GOLDEN / "every_kind_v1_2.jsonl"
    p = tmp_path / src.name
    shutil.copy(src, p)
    code, _, err = run(capsys, "prove", p, "--seq", 1, "-o", tmp_path / "x.json", "--pubkey",
                       GOLDEN / "every_kind_v1_2.pub")
    assert code == 2 and "proofs need format 1.3" in err
    code, _, err = run(capsys, "tree-head", p, "--pubkey", GOLDEN / "every_kind_v1_2.pub")
    assert code == 2 and "not checkpoints" in err


def test_witness_commands_end_to_end(tmp_path, signer, keypair, capsys):
    pub = keypair[2]
    p = _journal(tmp_path / "j.jsonl", signer, 700, close=False)
    code, _, _ = run(capsys, "keygen", tmp_path / "w", "--name", "w1")
    code, vkey, _ = run(capsys, "witness", "vkey", "--key", tmp_path / "w" / "w1.key", "--name", "w1")
    assert code == 0 and vkey.startswith("w1+")
    (tmp_path / "w1.vkey").write_text(vkey)
    b = tmp_path / "b.json"
    run(capsys, "prove", p, "--seq", 3, "-o", b, "--pubkey", pub)
    size = int(json.loads(b.read_text())["checkpoint"].split("\n")[1])
    cosigned = tmp_path / "b.cos.json"
    w = ["--key", tmp_path / "w" / "w1.key", "--name", "w1", "--state", tmp_path / "state.json", "--log-key", pub]
    code, text, _ = run(capsys, "witness", "cosign", b, *w, "-o", cosigned)
    assert code == 0
    code, text, _ = run(capsys, "verify-proof", cosigned, "--pubkey", pub, "--witness-key", tmp_path / "w1.vkey")
    assert code == 0 and "cosigned by w1" in text and "published: 1 of the quorum of 1" in text
    code, text, _ = run(capsys, "verify-proof", b, "--pubkey", pub, "--witness-key", vkey.strip())
    assert code == 1 and "fewer than the quorum of 1" in text
    _grow(p, signer, 300, 700)
    c = tmp_path / "c.json"
    run(capsys, "consistency", p, "--from", size, "-o", c, "--pubkey", pub)
    code, _, _ = run(capsys, "witness", "cosign", c, *w)
    assert code == 0
    code, text, _ = run(capsys, "witness", "cosign", b, *w)
    assert code == 1 and text.startswith("REFUSED") and "rollback" in text
    (tmp_path / "state.json").write_text('{"x": {"size": "big"}}')
    code, _, err = run(capsys, "witness", "cosign", c, *w)
    assert code == 2 and "not a witness state file" in err


def test_hostile_inputs_to_the_proof_commands(tmp_path, signer, keypair, capsys):
    import os

    pub = keypair[2]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "verify-proof", fifo, "--pubkey", pub)
    assert code == 2 and "not a regular file" in err
    p = _journal(tmp_path / "j.jsonl", signer, 50)
    code, _, err = run(capsys, "verify", p, "--pubkey", pub, "--expect-checkpoint", fifo)
    assert code == 2 and "not a regular file" in err
    code, _, err = run(capsys, "verify", p, "--pubkey", pub, "--witness-quorum", 1)
    assert code == 2 and "--expect-checkpoint" in err
    (tmp_path / "deep.json").write_text("[" * 100_000)
    code, text, _ = run(capsys, "verify-proof", tmp_path / "deep.json", "--pubkey", pub)
    assert code == 1 and "not a proof bundle" in text
    code, _, err = run(capsys, "prove", p, "--seq", 1, "-o", tmp_path / "no" / "such" / "b.json", "--pubkey", pub)
    assert code == 2 and "is not a folder" in err
    # Someone without the key appends a seal line whose tree root and head are not hashes: prove, which reads the
    # latest seal without verifying the whole journal, names it in one line (exit 1), no traceback.
    lines = read_lines(p)
    last = parse(lines[-1])
    n = last["seq"] + 1
    fake = {"kind": "seal", "sealed_seq": n - 1, "sealed_hash": "q" * 64, "key_id": last["key_id"], "sig": "AA==",
            "tree_size": n, "tree_root": "zz" * 32, "seq": n, "ts": 1, "h": "0" * 64}
    write_lines(p, lines + [dump(fake)])
    code, _, err = run(capsys, "prove", p, "--seq", 1, "-o", tmp_path / "b.json", "--pubkey", pub)
    assert code == 1 and f"seal at seq {n} names no tree" in err and len(err.strip().splitlines()) == 1
