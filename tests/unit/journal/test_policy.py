"""C2SP tlog-policy files (journal/proofs/policy.py): the spec's two-level example evaluated with real keys, every
syntax rule the spec states refused with the line named, and checkpoints held to a policy with Ed25519 and
ML-DSA-44 witnesses."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA44PrivateKey

from trainledger.journal.note import NoteError, checkpoint_text, cosign, cosigner_key, sign_note, verifier_key
from trainledger.journal.proofs.policy import PolicyError, check_checkpoint, evaluate, parse_policy

ORIGIN = "example.com/team-log"


def _ed():
    k = Ed25519PrivateKey.generate()
    return k, k.public_key().public_bytes_raw()


LOG, LOG_PUB = _ed()
W = {n: _ed() for n in ("X1", "X2", "X3", "Y1", "Y2", "Y3")}
ML = MLDSA44PrivateKey.generate()


def _example() -> bytes:
    lines = [f"log {verifier_key(ORIGIN, LOG_PUB)} https://example.com/team-log/"]
    for n, (_, pub) in W.items():
        lines.append(f"witness {n} {cosigner_key(f'w.example/{n}', pub)}")
        if n == "X3":
            lines.append("group X-witnesses 2 X1 X2 X3")
    lines += ["group Y-witnesses any Y1 Y2 Y3", "", "# both organisations", "  group X-and-Y\tall X-witnesses Y-witnesses",
              "quorum X-and-Y"]
    return "\n".join(lines).encode() + b"\n"


def test_the_specs_two_level_example():
    p = parse_policy(_example())
    assert [v.name for v in p.logs] == [ORIGIN] and p.log_urls[ORIGIN] == "https://example.com/team-log/"
    assert p.groups["X-witnesses"] == (2, ("X1", "X2", "X3")) and p.groups["Y-witnesses"][0] == 1
    assert p.groups["X-and-Y"] == (2, ("X-witnesses", "Y-witnesses")) and p.quorum == "X-and-Y"
    q = evaluate(p, {"X1": 1, "X3": 2, "Y2": 3})
    assert q.met and q.detail.startswith("quorum met: X-and-Y: 2 of 2, 2 needed (X-witnesses: 2 of 3, 2 needed")
    assert not evaluate(p, {"X1": 1, "Y1": 2, "Y2": 3}).met  # one X witness is not two
    assert not evaluate(p, {"X1": 1, "X2": 2}).met  # no Y witness
    assert evaluate(parse_policy(b"quorum none\n"), {}).met


@pytest.mark.parametrize("text, says", [
    (b"witness A {w}\ngroup G 1 A B\nquorum G\n", "names 'B', which no earlier line defines"),
    (b"group G any A\nwitness A {w}\nquorum G\n", "no earlier line defines"),
    (b"witness A {w}\nquorum B\n", "the quorum names 'B'"),
    (b"witness A {w}\nwitness B {w}\nquorum A\n", "duplicate key"),
    (b"witness A {w}\ngroup G 2 A\nquorum G\n", "needs 1 <= k <= 1, got 2"),
    (b"witness A {w}\ngroup G 01 A\nquorum G\n", "threshold must be all, any or a decimal"),
    (b"witness A {w}\ngroup G any A A\nquorum G\n", "lists a member twice"),
    (b"witness A {w}\nquorum A\nquorum A\n", "a second quorum line"),
    (b"witness A {w}\n", "no quorum line"),
    (b"witness none {w}\nquorum none\n", "reserved"),
    (b"witness A {l}\nquorum A\n", "must be of type 0x04 or 0x06"),
    (b"log {w}\nquorum none\n", "must be of type 0x01"),
    (b"witness A {w}\x0b\nquorum A\n", "control character 0x0b"),
    (b"witnesses A {w}\nquorum A\n", "unknown line 'witnesses'"),
    (b"witness A not+a+key\nquorum A\n", "witness key"),
    # found by mutating a policy at random: a key name with a byte that is not UTF-8 ended verify in a traceback
    (b"witness A \xa7{w}\nquorum A\n", "a key name is UTF-8 text with no spaces"),
])
def test_every_rule_of_the_syntax_is_enforced_and_the_line_named(text, says):
    w = cosigner_key("w.example/A", W["X1"][1]).encode()
    data = text.replace(b"{w}", w).replace(b"{l}", verifier_key("l", W["X2"][1]).encode())
    with pytest.raises(PolicyError, match=says) as e:
        parse_policy(data, "team.policy")
    assert str(e.value).startswith("team.policy")


def test_a_checkpoint_is_held_to_the_policy_with_ed25519_and_ml_dsa_witnesses():
    """A log-signed checkpoint with an Ed25519 and an ML-DSA-44 cosignature: 'all' of the two met; one missing not
    met; a checkpoint another key signed, or of another origin, refused."""
    ml_pub = ML.public_key().public_bytes_raw()
    policy = parse_policy((f"log {verifier_key(ORIGIN, LOG_PUB)}\n"
                           f"witness ed {cosigner_key('w.example/ed', W['X1'][1])}\n"
                           f"witness pq {cosigner_key('w.example/pq', ml_pub)}\n"
                           "group both all ed pq\nquorum both\n").encode())
    cp = checkpoint_text(ORIGIN, 3, bytes(range(32)))
    note = sign_note(cp, ORIGIN, LOG)
    ed_line = cosign(cp, "w.example/ed", W["X1"][0], 1_800_000_000)
    pq_line = cosign(cp, "w.example/pq", ML, 1_800_000_001)
    got, q = check_checkpoint(policy, note + ed_line + pq_line)
    assert got.size == 3 and q.met and q.witnesses == {"ed": 1_800_000_000, "pq": 1_800_000_001}
    _, q = check_checkpoint(policy, note + pq_line)
    assert not q.met and "ed missing" in q.detail
    with pytest.raises(NoteError):
        check_checkpoint(policy, sign_note(cp, ORIGIN, Ed25519PrivateKey.generate()) + ed_line)
    other = checkpoint_text("elsewhere.example/log", 3, bytes(range(32)))
    with pytest.raises(NoteError):
        check_checkpoint(policy, sign_note(other, ORIGIN, LOG))
