"""Keys: keygen, permissions, key ids, trusted-keys files."""

from __future__ import annotations

import os
import stat

import pytest

from journal import KeyFileError, Signer, UsageError, keygen, load_public_key, load_signer, trusted_keys
from journal.keys import TRUSTED_KEYS_ENV, key_id_of, parse_public_key


def test_keygen_writes_0600_pem_and_one_line_public_key(tmp_path):
    priv, pub = keygen(tmp_path / "k")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    lines = pub.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainledger-ed25519 ")
    signer, pk = load_signer(priv), load_public_key(pub)
    assert signer.key_id == pk.key_id == key_id_of(pk.raw) and len(pk.key_id) == 16


def test_keygen_refuses_to_overwrite(tmp_path):
    keygen(tmp_path)
    before = (tmp_path / "trainledger.key").read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        keygen(tmp_path)
    assert (tmp_path / "trainledger.key").read_bytes() == before


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_private_key_readable_by_others_is_refused(tmp_path, mode):
    priv, _ = keygen(tmp_path)
    os.chmod(priv, mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signer(priv)


def test_public_key_given_as_private_key(tmp_path):
    _, pub = keygen(tmp_path)
    with pytest.raises(KeyFileError, match="this is a public key"):
        load_signer(pub)


def test_private_key_given_as_public_key(tmp_path):
    priv, _ = keygen(tmp_path)
    with pytest.raises(KeyFileError, match="this is a private key"):
        load_public_key(priv)


@pytest.mark.parametrize("text", ["", "ssh-ed25519 AAAA", "trainledger-ed25519 !!!", "trainledger-ed25519 AAAA"])
def test_malformed_public_keys(text):
    with pytest.raises(KeyFileError):
        parse_public_key(text)


def test_public_key_with_wrong_key_id_comment():
    s = Signer.generate()
    with pytest.raises(KeyFileError, match="does not match"):
        parse_public_key(f"trainledger-ed25519 {s.public.b64} {'0' * 16}")


def test_missing_and_directory_key_files(tmp_path):
    with pytest.raises(KeyFileError, match="not found"):
        load_signer(tmp_path / "nope.key")
    with pytest.raises(KeyFileError, match="is a directory"):
        load_public_key(tmp_path)


def test_trusted_keys_file_from_environment(tmp_path):
    _, pub1 = keygen(tmp_path / "a")
    _, pub2 = keygen(tmp_path / "b")
    listing = tmp_path / "allowed"
    listing.write_text(f"# team keys\n{pub2.read_text()}\n\n")
    keys = trusted_keys([str(pub1)], env={TRUSTED_KEYS_ENV: str(listing)})
    assert [k.key_id for k in keys] == [load_public_key(pub1).key_id, load_public_key(pub2).key_id]


def test_signatures_verify_only_under_their_key():
    a, b = Signer.generate(), Signer.generate()
    sig = a.sign(b"msg")
    assert a.public.verify(sig, b"msg") and not b.public.verify(sig, b"msg") and not a.public.verify(sig, b"msh")
