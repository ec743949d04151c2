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
