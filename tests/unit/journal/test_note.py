"""C2SP signed notes, checkpoints and cosignatures: the Go reference implementation's example byte for byte
(golang.org/x/mod/sumdb/note: the PeterNeumann key and note), tampering refused."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainledger.journal.merkle import leaf_hash, root
from trainledger.journal.note import (
    NoteError,
    checkpoint_text,
    cosign,
    open_note,
    parse_checkpoint,
    parse_verifier_key,
    sign_note,
    verifier_key,
    verify_cosignature,
)

VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
SEED = base64.b64decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")[1:]  # PRIVATE+KEY+PeterNeumann+c74f20a3+...
TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
SIGNED = TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"


def test_the_reference_example_byte_for_byte():
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    assert verifier_key("PeterNeumann", key.public_key().public_bytes_raw()) == VKEY
    assert sign_note(TEXT, "PeterNeumann", key) == SIGNED
    text, who = open_note(SIGNED, [parse_verifier_key(VKEY)])
    assert text == TEXT and who[0].name == "PeterNeumann" and who[0].hash == 0xC74F20A3


@pytest.mark.parametrize("mangle", [
    lambda m: m.replace("problem,", "problem;"),  # the text changed
    lambda m: m.replace("x08go", "x08gp"),  # the signature changed
    lambda m: m.replace("\n\n", "\n"),  # no blank line
    lambda m: m.replace("\u2014", "--"),  # not an em dash
])
def test_tampering_is_refused(mangle):
    with pytest.raises(NoteError):
        open_note(mangle(SIGNED), [parse_verifier_key(VKEY)])


def test_unpinned_keys_are_ignored_and_nothing_pinned_refuses():
    other = Ed25519PrivateKey.generate()
    msg = SIGNED + sign_note(TEXT, "someone-else", other).split("\n\n")[1]
    assert len(open_note(msg, [parse_verifier_key(VKEY)])[1]) == 1
    with pytest.raises(NoteError, match="no signature by a pinned key"):
        open_note(msg, [parse_verifier_key(verifier_key("nobody", Ed25519PrivateKey.generate().public_key()
                                                            .public_bytes_raw()))])
    with pytest.raises(NoteError):
        parse_verifier_key(VKEY.replace("c74f20a3", "c74f20a4"))  # a hash that is not the key's


def test_a_checkpoint_of_a_journal_tree_and_a_witness_cosignature():
    leaves = [leaf_hash(f"line {i}".encode()) for i in range(10)]
    text = checkpoint_text("trainledger/run-1", 10, root(leaves))
    cp = parse_checkpoint(text)
    assert (cp.origin, cp.size, cp.root) == ("trainledger/run-1", 10, root(leaves))
    log = Ed25519PrivateKey.generate()
    note = sign_note(text, "trainledger/run-1", log)
    assert open_note(note, [parse_verifier_key(verifier_key("trainledger/run-1", log.public_key()
                                                            .public_bytes_raw()))])[0] == text
    witness = Ed25519PrivateKey.generate()
    line = cosign(text, "witness.example/w1", witness, 1_796_000_000)
    pub = witness.public_key().public_bytes_raw()
    assert verify_cosignature(text, line, "witness.example/w1", pub) == 1_796_000_000
    with pytest.raises(NoteError):
        verify_cosignature(checkpoint_text("trainledger/run-1", 11, root(leaves + [leaves[0]])), line,
                           "witness.example/w1", pub)  # another checkpoint
    with pytest.raises(NoteError):
        parse_checkpoint("origin\n01\n" + base64.b64encode(bytes(32)).decode() + "\n")  # a padded size


def test_a_cosignature_line_has_the_c2sp_layout():
    """C2SP tlog-cosignature's example line (witness.example.com/w1 on example.com/behind-the-sofa) is key ID (4
    bytes) || timestamp (8, big-endian) || Ed25519 signature (64): the layout ``cosign`` writes. (The spec does not
    publish the witness's key, so only the layout can be compared.)"""
    import base64
    import struct

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from trainledger.journal.note import cosign, cosigner_key, parse_verifier_key, verify_cosignature

    spec = base64.b64decode("jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+"
                            "mbIUBkBIfZ+qnA==")
    assert len(spec) == 76 and struct.unpack(">Q", spec[4:12])[0] == 1679315147  # 2023-03-20, as in the spec
    key = Ed25519PrivateKey.from_private_bytes(bytes(32))
    text = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    line = cosign(text, "witness.example.com/w1", key, 1679315147)
    mine = base64.b64decode(line.rsplit(" ", 1)[1])
    assert len(mine) == 76 and mine[4:12] == spec[4:12]
    v = parse_verifier_key(cosigner_key("witness.example.com/w1", key.public_key().public_bytes_raw()))
    assert mine[:4] == v.hash.to_bytes(4, "big") and v.sig_type == 0x04
    assert verify_cosignature(text, line, v.name, v.public) == 1679315147


# ---------------------------------------------------------------- ML-DSA-44 cosignatures (tlog-cosignature)


def test_the_subtree_message_is_laid_out_as_the_spec_says():
    """The ML-DSA-44 cosigner's signed message, built by hand from tlog-cosignature's struct: a 12-byte label, the
    name and the origin each behind a one-byte length, the timestamp, start and end as big-endian u64, the root."""
    from trainledger.journal.note import subtree_message

    r = bytes(range(32))
    want = (b"subtree/v1\n\x00" + b"\x02w1" + (1679315147).to_bytes(8, "big") + b"\x0bexample.com"
            + (0).to_bytes(8, "big") + (20852163).to_bytes(8, "big") + r)
    assert subtree_message("w1", 1679315147, "example.com", 0, 20852163, r) == want
    with pytest.raises(NoteError):
        subtree_message("w" * 256, 0, "o", 0, 1, r)


def test_an_ml_dsa_44_cosignature_verifies_here_and_under_an_independent_implementation():
    """A witness's ML-DSA-44 cosignature: its vkey is of type 0x06 (the 1312-byte key), its line carries the key
    hash, the timestamp and a 2420-byte signature; it verifies here and under dilithium-py (a pure-Python FIPS 204
    implementation, independent of the cryptography package that made it) over the subtree/v1 message. It does not
    cover extension lines (the spec: they are not signed), while an Ed25519 cosignature does; another root, another
    name or a flipped signature byte is refused."""
    from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA44PrivateKey
    from dilithium_py.ml_dsa import ML_DSA_44

    from trainledger.journal.note import (SIG_MLDSA44_COSIGNATURE, check_cosignatures, cosigner_key,
                                          subtree_message)

    key = MLDSA44PrivateKey.generate()
    pub = key.public_key().public_bytes_raw()
    vkey = cosigner_key("witness.example/w1", pub)
    v = parse_verifier_key(vkey)
    assert v.sig_type == SIG_MLDSA44_COSIGNATURE and v.public == pub and len(pub) == 1312
    cp = checkpoint_text("example.com/log", 5, root([leaf_hash(bytes([i])) for i in range(5)]))
    line = cosign(cp, "witness.example/w1", key, 1_700_000_000)
    raw = base64.b64decode(line.split()[-1])
    assert len(raw) == 4 + 8 + 2420 and int.from_bytes(raw[4:12], "big") == 1_700_000_000
    assert verify_cosignature(cp, line, "witness.example/w1", pub) == 1_700_000_000
    c = parse_checkpoint(cp)
    msg = subtree_message("witness.example/w1", 1_700_000_000, c.origin, 0, c.size, c.root)
    assert ML_DSA_44.verify(pub, msg, raw[12:])
    signed = sign_note(cp, "example.com/log", Ed25519PrivateKey.generate())
    assert [ts for _, ts in check_cosignatures(signed + line, [v])] == [1_700_000_000]
    with_ext = cp + "an extension line\n"
    assert verify_cosignature(with_ext, line, "witness.example/w1", pub) == 1_700_000_000
    ed = Ed25519PrivateKey.generate()
    ed_line = cosign(cp, "witness.example/w2", ed, 1_700_000_000)
    with pytest.raises(NoteError):
        verify_cosignature(with_ext, ed_line, "witness.example/w2", ed.public_key().public_bytes_raw())
    other = checkpoint_text("example.com/log", 5, bytes(32))
    bad = bytearray(raw)
    bad[100] ^= 1
    for args in [(other, line, "witness.example/w1", pub), (cp, line, "witness.example/w9", pub),
                 (cp, f"\u2014 witness.example/w1 {base64.b64encode(bytes(bad)).decode()}\n", "witness.example/w1",
                  pub)]:
        with pytest.raises(NoteError):
            verify_cosignature(*args)
    with pytest.raises(NoteError):  # a pinned witness's forged cosignature rejects the note, never counted absent
        check_cosignatures(signed + f"\u2014 witness.example/w1 {base64.b64encode(bytes(bad)).decode()}\n", [v])
