"""Unsigned events never pass as verified: every reading command refuses them, or leaves them out when asked.

The attacker here can write the run folder but does not hold the key: they keep the signed lines and append
events re-chained without a seal (which they cannot sign), or build a journal around a victim's public key.
"""

from __future__ import annotations

import json
import os

import pytest
from journal_tools import dump, parse, read_lines, rechain, write_lines
from test_cli import run

from trainledger.journal import Journal, UnsealedEvents, load_public_key, read_events, verify


def _forged_verdict() -> bytes:
    return dump({"kind": "gate_verdict", "rung": "rung_i", "passed": True, "reason": "all bars cleared",
                 "measured": {"final_loss": 0.1}, "bars": {"max_final_loss": 5.0}, "artifacts": {},
                 "seq": 0, "ts": 1, "h": "0" * 64})


@pytest.fixture
def signed(tmp_path, keypair):
    """A closed signed journal of 40 steps and its public key file."""
    signer, _, pub = keypair
    p = tmp_path / "run" / "journal.jsonl"
    with Journal.create(p, signer=signer, seal_every=10, background=False) as j:
        from conftest import step

        for i in range(40):
            j.append(step(i))
    return p, pub


def _append_unsealed(p, extra: list[bytes], *, keep: int | None = None) -> None:
    lines = read_lines(p)
    if keep is not None:
        lines = lines[:keep]
    else:
        lines = lines[:-2]  # drop run_closed and its seal: the run looks live
    write_lines(p, rechain(lines + extra))


def _steps(n: int, start: int = 100) -> list[bytes]:
    return [dump({"kind": "step_observed", "step": start + i, "loss": 0.01, "seq": 0, "ts": 1, "h": "0" * 64})
            for i in range(n)]


def test_appended_unsealed_events_fail_verify(signed, capsys):
    p, pub = signed
    _append_unsealed(p, _steps(5) + [_forged_verdict()])
    code, out, _ = run(capsys, "verify", p, "--pubkey", pub)
    assert code == 1 and out.startswith("FAIL") and "6 events after seq" in out and "not signed" in out
    code, out, _ = run(capsys, "verify", p, "--pubkey", pub, "--allow-unsealed")
    assert code == 0 and "UNSIGNED  6 events after seq" in out and "NOT signed" in out
    r = verify(p, keys=[load_public_key(pub)], allow_unsealed=True)
    assert r.unsealed_events == 6 and r.sealed_bytes < r.bytes


def test_forged_go_verdict_is_not_replayed(signed, capsys):
    p, pub = signed
    _append_unsealed(p, [_forged_verdict()])
    code, out, _ = run(capsys, "replay", p, "--pubkey", pub)
    assert code == 1 and out.startswith("FAIL") and "not signed" in out
    code, out, _ = run(capsys, "replay", p, "--pubkey", pub, "--allow-unsealed", "--json")
    d = json.loads(out)
    assert d["ladder"] is None  # the forged verdict is left out, not folded
    assert d["verify"]["unsealed_events"] == 1
    code, out, _ = run(capsys, "replay", p, "--pubkey", pub, "--allow-unsealed")
    assert "UNSIGNED: 1 events after seq" in out and "GO" not in out


def test_query_refuses_or_leaves_out_unsealed_events(signed, capsys):
    p, pub = signed
    _append_unsealed(p, _steps(7))
    code, _, err = run(capsys, "query", "--pubkey", pub, p, "SELECT count(*) AS n FROM steps")
    assert code == 1 and "not signed" in err
    code, out, _ = run(capsys, "query", "--pubkey", pub, "--allow-unsealed", "--format", "json", p,
                       "SELECT count(*) AS n, max(step) AS last FROM steps")
    assert code == 0 and json.loads(out) == [{"n": 40, "last": 39}]


def test_report_refuses_or_marks_unsealed_events(signed, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    p, pub = signed
    _append_unsealed(p, _steps(3))
    out_html = tmp_path / "r.html"
    code, _, _ = run(capsys, "report", p, "--pubkey", pub, "-o", out_html)
    assert code == 1 and not out_html.exists()
    code, _, _ = run(capsys, "report", p, "--pubkey", pub, "--allow-unsealed", "-o", out_html)
    page = out_html.read_text()
    assert code == 0 and "3 events after them are NOT signed" in page


def test_journal_built_from_the_public_key_alone_never_verifies(signed, capsys):
    p, pub = signed
    opened = parse(read_lines(p)[0])  # the victim's run_opened: public key, key id, run id are all public
    forged = [dump(opened)] + _steps(20, start=0) + [_forged_verdict()]
    write_lines(p, rechain(forged))
    for flags in ((), ("--allow-unsealed",)):
        code, out, _ = run(capsys, "verify", p, "--pubkey", pub, *flags)
        assert code == 1 and "no seal in the journal" in out, flags
    code, out, _ = run(capsys, "replay", p, "--pubkey", pub, "--allow-unsealed")
    assert code == 1 and "OK" not in out


def test_library_verify_raises_unsealed_events(signed, pubkey):
    p, _ = signed
    _append_unsealed(p, _steps(2))
    with pytest.raises(UnsealedEvents) as ei:
        verify(p, keys=[pubkey])
    assert ei.value.seq == verify(p, keys=[pubkey], allow_unsealed=True).trusted_last_seq + 1


def test_open_append_moves_unsealed_events_aside(signed, signer, pubkey):
    p, _ = signed
    _append_unsealed(p, _steps(4))
    before = verify(p, keys=[pubkey], allow_unsealed=True)
    with Journal.open_append(p, signer=signer, background=False) as j:
        assert j.seq == before.trusted_last_seq + 3  # tail_repaired and its seal take the forged events' seqs
    after = verify(p, keys=[pubkey], require_closed=True)
    assert after.unsealed_events == 0 and after.kinds.get("tail_repaired") == 1
    repaired = next(e for e in read_events(p) if type(e).__struct_config__.tag == "tail_repaired")
    assert repaired.unsealed_events == 4 and repaired.sidecar.startswith("journal.jsonl.unsealed-")
    side = (p.parent / repaired.sidecar).read_bytes()
    assert side.count(b"\n") == 4 and b'"step":100' in side  # moved aside, never deleted
    assert not any(getattr(e, "step", None) == 100 for e in read_events(p))


def test_sidecar_name_planted_as_a_link_is_replaced_not_followed(signed, signer, tmp_path):
    p, _ = signed
    _append_unsealed(p, _steps(1))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, p.with_name(f"{p.name}.tail-{os.getpid()}.tmp"))
    Journal.open_append(p, signer=signer, background=False).close()
    assert victim.read_text() == "keep me"


def test_head_prints_the_sealed_head_of_a_live_run(signed, capsys, pubkey):
    p, pub = signed
    _append_unsealed(p, _steps(2))
    code, out, err = run(capsys, "head", p, "--pubkey", pub)
    r = verify(p, keys=[pubkey], allow_unsealed=True)
    assert code == 0 and out.strip() == r.head and "2 events after it are not signed" in err
