"""The writer's parts on their own: the chain and its buffer make the format's bytes (docs/FORMAT.md's worked example,
byte for byte, with no file and no clock), and the Journal over them appends as it always did."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from journal_tools import read_lines

from trainledger.journal import Journal, JournalClosed, StepObserved, verify
from trainledger.journal import writer
from trainledger.journal.chain import genesis
from trainledger.journal.chainbuffer import ChainBuffer, chain_line
from trainledger.journal.codec import encode_event
from trainledger.journal.events import FORMAT_VERSION, RunOpened
from trainledger.journal.keys import Signer
from trainledger.journal.merkle import CompactRange
from trainledger.journal.sealer import Sealer

ROOT = Path(__file__).resolve().parents[3]
TS = [1764374400000000000, 1764374400250000000, 1764374400250100000]


def _format_example_lines() -> list[bytes]:
    text = (ROOT / "docs" / "FORMAT.md").read_text()
    block = re.search(r"The journal, three lines:\n\n```\n(.*?)```", text, re.S)
    assert block, "docs/FORMAT.md has no worked example"
    return [x.encode() + b"\n" for x in block.group(1).splitlines()]


def test_the_chain_buffer_and_the_sealer_make_the_worked_example_byte_for_byte():
    signer = Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    chain = ChainBuffer(0, genesis("example-run"), CompactRange(0))
    sealer = Sealer(signer, "example-run", seal_every=1000, seal_interval_ns=10**9, in_background=False,
                    sign_wait_s=1.0, kick=threading.Event(), label="example", now=TS[0])
    chain.add(encode_event(RunOpened(format_version=FORMAT_VERSION, run_id="example-run", key_id=signer.key_id,
                                     public_key=signer.public.b64, host="example-host", pid=4242,
                                     software={"trainledger": "0.1.0"})), TS[0])
    seq, hx = chain.add(encode_event(StepObserved(step=0, loss=2.5, grad_norm=float("nan"), lr=0.0003,
                                                  tokens=4096)), TS[1])
    assert seq == 1 and chain.head == (1, hx.decode())
    chain.add(encode_event(sealer.seal(chain)), TS[2])
    want = _format_example_lines()
    assert len(want) == 3 and bytes(chain.buf) == b"".join(want)
    # the tree took in the two lines the seal names, and the buffer's lines leave it once written
    assert chain.tree is not None and chain.tree.end == 2
    chain.hash_pending()
    chain.written(len(want[0]))
    assert bytes(chain.buf) == b"".join(want[1:]) and chain.tree.end == 3


def test_the_python_chain_step_writes_what_the_accelerator_writes():
    from trainledger.journal import accel

    fast = getattr(accel.fast, "chain_append", None)
    if fast is None:
        pytest.skip("the C accelerator is not built")
    prev = genesis("r")
    for body in (b'{"kind":"x"}', b'{"kind":"step_observed","step":3,"loss":1.5}', b'{"kind":"y","s":"\\u00e9"}'):
        a, b = bytearray(b"kept"), bytearray(b"kept")
        assert chain_line(a, body, prev, 7, 123) == fast(b, body, prev, 7, 123) and a == b


def test_each_append_returns_its_seq_and_the_hash_its_line_carries(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False, seal_every=7) as j:
        got = [j.append(StepObserved(step=i, loss=1.0 / (i + 1))) for i in range(40)]
        assert j.last_appended() == StepObserved(step=39, loss=1.0 / 40)
    lines = {msgspec.json.decode(x)["seq"]: msgspec.json.decode(x) for x in read_lines(tmp_path / "j.jsonl")}
    for seq, hx in got:
        assert isinstance(hx, str) and lines[seq]["h"] == hx and lines[seq]["kind"] == "step_observed"
    kinds = [lines[s]["kind"] for s in sorted(lines)]
    assert kinds.count("seal") >= 40 // 7  # the seals came due inside append, every seventh event


def test_a_deferred_event_waiting_is_written_before_the_next_append(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False) as j:
        j.append_deferred(StepObserved(step=0, loss=1.0))
        j.append(StepObserved(step=1, loss=1.0))
    steps = [msgspec.json.decode(x).get("step") for x in read_lines(tmp_path / "j.jsonl")]
    assert [s for s in steps if s is not None] == [0, 1]


def test_a_durable_append_seals_at_once_and_a_closed_journal_refuses(tmp_path, signer):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, background=False)
    j.append(StepObserved(step=0, loss=1.0), durable=True)
    assert j._sealer.since_seal == 0  # sealed at once
    assert j.seal() is None  # nothing left to seal
    j.close()
    with pytest.raises(JournalClosed):
        j.append(StepObserved(step=1, loss=1.0))


def test_threads_appending_keep_one_chain(tmp_path, signer, pubkey):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, seal_every=50)

    def work(k):
        for i in range(500):
            if i % 2:
                j.append(StepObserved(step=k * 1000 + i, loss=float(i)))
            else:
                j.append_deferred(StepObserved(step=k * 1000 + i, loss=float(i)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    j.close()
    rep = verify(tmp_path / "j.jsonl", keys=[pubkey], require_closed=True)
    assert rep.ok and rep.kinds["step_observed"] == 2000


def test_an_interval_past_64_bits_is_never_reached(tmp_path, signer):
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False, seal_interval_s=1e12,
                        flush_interval_s=1e12) as j:
        j.append(StepObserved(step=0, loss=1.0))
        assert j._sealer.seal_interval_ns == writer._NEVER_NS == j._flush_interval_ns


def test_a_drain_seals_every_seal_every_events_inside_its_batch(tmp_path, signer, pubkey):
    """The deferred path chains a batch with the chain's state in locals: every seal inside the batch sees the head
    it seals, and the state written back after the batch is the chain's."""
    with Journal.create(tmp_path / "j.jsonl", signer=signer, background=False, seal_every=7) as j:
        for i in range(100):
            j.append_deferred(StepObserved(step=i, loss=1.0))
        j.append(StepObserved(step=100, loss=1.0))  # drains the last batch first, then chains after it
        assert j.head[0] == j.seq - 1
    recs = [msgspec.json.decode(x) for x in read_lines(tmp_path / "j.jsonl")]
    steps = [r["step"] for r in recs if r["kind"] == "step_observed"]
    assert steps == list(range(101))
    assert sum(r["kind"] == "seal" for r in recs) >= 101 // 7
    assert verify(tmp_path / "j.jsonl", keys=[pubkey], require_closed=True).ok
