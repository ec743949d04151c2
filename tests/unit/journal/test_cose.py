"""COSE Receipts (RFC 9942, RFC9162_SHA256) and checkpoint statements (journal/proofs/cose.py): every leaf of trees
of every size up to 33 proven and checked here and by pycose, an independent COSE implementation (the signature with
the reconstructed root as its detached payload); every single flipped byte refused but one, named (the unsigned tree
size moved to a size of the same shape: the same leaf under the same signed root); EdDSA under a run key, ES256
under a P-256 release key; the CBOR deterministic."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from pycose.keys import EC2Key, OKPKey
from pycose.messages import Sign1Message

from trainledger.journal import Signer
from trainledger.journal.merkle import inclusion_proof, leaf_hash, root
from trainledger.journal.proofs.cose import (EDDSA, ES256, RFC9162_SHA256, VDP, VDS, CoseError, cbor_decode,
                                             cbor_encode, receipt, statement, verify_receipt, verify_statement)


def _pycose_key(signer):
    if isinstance(signer, Signer):
        return OKPKey(crv="ED25519", x=signer.public.raw)
    n = signer.public_key().public_numbers()
    return EC2Key(crv="P_256", x=n.x.to_bytes(32, "big"), y=n.y.to_bytes(32, "big"))


def _public(signer):
    if isinstance(signer, Signer):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        return Ed25519PublicKey.from_public_bytes(signer.public.raw)
    return signer.public_key()


def test_cbor_is_deterministic_and_reads_back():
    assert cbor_encode({VDS: 1, 1: -8, 4: b"k"}) == bytes.fromhex("a30127044" "16b19018b01")
    for v in [0, 23, 24, 255, 256, 65536, 1 << 40, -1, -25, b"", b"x" * 300, "é", [1, [2, None]], {"a": True}]:
        assert cbor_decode(cbor_encode(v)) == v
    with pytest.raises(CoseError):
        cbor_decode(b"\x9f\x01\xff")  # an indefinite length
    with pytest.raises(CoseError):
        cbor_decode(b"\x5a\xff\xff\xff\xff")  # a string past the end


@pytest.mark.parametrize("kind", ["eddsa", "es256"])
def test_every_leaf_of_every_small_tree_checks_here_and_under_pycose(kind):
    signer = Signer.generate() if kind == "eddsa" else ec.generate_private_key(ec.SECP256R1())
    pub, key = _public(signer), _pycose_key(signer)
    for size in range(1, 34):
        entries = [f"line {i} of {size}".encode() for i in range(size)]
        leaves = [leaf_hash(e) for e in entries]
        r = root(leaves)
        for i in range(size):
            data = receipt(i, size, inclusion_proof(leaves, i), r, signer)
            assert verify_receipt(data, entries[i], pub) == (i, size, r)
            msg = Sign1Message.decode(data)
            msg.key = key
            assert msg.verify_signature(detached_payload=r)
            assert msg.phdr[VDS] == RFC9162_SHA256 and msg.uhdr[VDP][-1]
            with pytest.raises(CoseError):  # another entry at the same place
                verify_receipt(data, entries[i] + b"x", pub)
    assert cbor_decode(msg.phdr_encoded)[1] == (EDDSA if kind == "eddsa" else ES256)


def test_every_flipped_byte_of_a_receipt_is_refused_here_and_by_pycose():
    """Here: every flipped byte, anywhere, fails (a receipt's own proof gives another root, and the signature
    fails), but one. pycose (which signs and checks COSE but knows no receipt proofs) refuses every flip in what the
    signature covers: the protected header and the signature itself."""
    signer = Signer.generate()
    pub, key = _public(signer), _pycose_key(signer)
    entries = [bytes([i]) * 7 for i in range(11)]
    leaves = [leaf_hash(e) for e in entries]
    data = receipt(6, 11, inclusion_proof(leaves, 6), root(leaves), signer)
    prot = cbor_decode(data).value[0]
    signed = set(range(data.index(prot), data.index(prot) + len(prot))) | set(range(len(data) - 64, len(data)))
    passed = []
    for k in range(len(data)):
        bad = bytearray(data)
        bad[k] ^= 0x01
        if k in signed:
            try:
                msg = Sign1Message.decode(bytes(bad))
                msg.key = key
                accepted = msg.verify_signature(detached_payload=root(leaves))
            except Exception:  # noqa: BLE001 - pycose refusing to decode or check it is a refusal too
                accepted = False
            assert not accepted, k
        try:
            got = verify_receipt(bytes(bad), entries[6], pub)
        except CoseError:
            continue
        # the one change a receipt cannot see: its (unsigned) tree size moved to one whose shape gives the same path
        # to the same signed root for the same leaf; what it proves is unchanged
        assert got[0] == 6 and got[2] == root(leaves) and got[1] != 11
        passed.append(got[1])
    assert passed == [10]


def test_a_checkpoint_statement_under_pycose_and_refused_when_changed():
    for signer in (Signer.generate(), ec.generate_private_key(ec.SECP256R1())):
        note = "trainledger/r\n3\n" + "A" * 43 + "=\n\n\u2014 trainledger/r abc\n"
        data = statement(note, signer)
        assert verify_statement(data, _public(signer)) == note
        msg = Sign1Message.decode(data)
        msg.key = _pycose_key(signer)
        assert msg.verify_signature() and msg.payload == note.encode()
        bad = data.replace(b"trainledger/r\n3", b"trainledger/r\n4")
        with pytest.raises(CoseError):
            verify_statement(bad, _public(signer))


def test_every_truncation_of_a_receipt_is_a_cose_error():
    """A receipt cut short anywhere, or with a text string that is not UTF-8, is refused as such, never another
    exception (a file someone without the key wrote reaches no traceback)."""
    signer = Signer.generate()
    leaves = [leaf_hash(bytes([i])) for i in range(5)]
    data = receipt(2, 5, inclusion_proof(leaves, 2), root(leaves), signer)
    for k in range(len(data)):
        with pytest.raises(CoseError):
            verify_receipt(data[:k], bytes([2]), _public(signer))
    with pytest.raises(CoseError, match="not UTF-8"):
        cbor_decode(b"\x62\xff\xfe")
