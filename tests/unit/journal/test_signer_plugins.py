"""Keys held by a service (a cloud KMS) sign through a back end registered for their URI scheme. No KMS is reachable
here and moto's KMS signs no Ed25519, so the plug-in protocol is tested with a stand-in back end
(tests/helpers/fake_kms.py) holding the key in memory, and the awskms:// back end that ships (journal/backends/kms.py) drives
boto3's real client over HTTP against a stand-in for the service (tests/helpers/kms_server.py)."""

from __future__ import annotations

import pytest

from trainledger.journal import Journal, StepObserved, verify
from trainledger.journal.errors import KeyFileError, UsageError
from trainledger.journal.keys import PluginSigner, load_signer

PLUGINS = "awskms=fake_kms:backend"


def test_a_journal_signed_through_a_registered_back_end_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINLEDGER_SIGNER_PLUGINS", PLUGINS)
    signer = load_signer("awskms:///alias/run-1")
    assert isinstance(signer, PluginSigner)
    j = Journal.create(tmp_path / "j.jsonl", signer=signer)
    for i in range(3000):
        j.append(StepObserved(step=i, loss=1.0))
    j.close()
    assert verify(tmp_path / "j.jsonl", keys=[signer.public], require_closed=True).ok
    assert load_signer("awskms:///alias/run-1").public.key_id == signer.key_id  # the service's key, not a new one
    with pytest.raises(KeyFileError, match="cannot be exported"):
        signer.private_pem()


def test_no_back_end_a_failing_service_and_a_bad_registration_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINLEDGER_SIGNER_PLUGINS", raising=False)
    with pytest.raises(UsageError, match="no signing back end for gcpkms is installed"):
        load_signer("gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k")
    monkeypatch.setenv("TRAINLEDGER_SIGNER_PLUGINS", "awskms=no_such_module:backend")
    with pytest.raises(UsageError, match="cannot be loaded"):
        load_signer("awskms:///alias/run")
    monkeypatch.setenv("TRAINLEDGER_SIGNER_PLUGINS", PLUGINS)
    signer = load_signer("awskms:///alias/flaky?fail=after-1")
    signer.sign(b"one")
    with pytest.raises(KeyFileError, match="signing failed: ConnectionError: ThrottlingException"):
        signer.sign(b"two")
    assert "fail=" not in repr(signer)  # the URI's query is not shown


@pytest.fixture
def kms(monkeypatch):
    pytest.importorskip("boto3")
    from kms_server import KmsStandIn

    k = KmsStandIn()
    monkeypatch.delenv("TRAINLEDGER_SIGNER_PLUGINS", raising=False)
    for name, value in {"AWS_ENDPOINT_URL_KMS": k.url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    yield k
    k.close()


def test_an_awskms_key_signs_the_journal_through_boto3(kms, tmp_path):
    signer = load_signer("awskms:///alias/run-42")
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, seal_every=500)
    for i in range(2000):
        j.append(StepObserved(step=i, loss=1.0))
    j.close()
    assert verify(tmp_path / "j.jsonl", keys=[signer.public], require_closed=True).ok
    signs = [body for action, body in kms.requests if action == "Sign"]
    assert len(signs) >= 3 and all(b["KeyId"] == "alias/run-42" and b["MessageType"] == "RAW" and
                                   b["SigningAlgorithm"] == "ED25519_SHA_512" for b in signs)
    assert signer.public.raw == kms.keys["alias/run-42"].public_key().public_bytes_raw()


def test_an_awskms_key_that_is_not_ed25519_or_is_throttled_is_one_line(kms):
    with pytest.raises(KeyFileError, match="a ECC_NIST_P256 key for SIGN_VERIFY, not an Ed25519 signing key"):
        load_signer("awskms:///alias/p256")
    with pytest.raises(KeyFileError, match="NotFoundException"):
        load_signer("awskms:///alias/none")
    signer = load_signer("awskms:///alias/run-42")
    kms.throttle = True
    with pytest.raises(KeyFileError, match="signing failed: ClientError: .*ThrottlingException"):
        signer.sign(b"x")
    with pytest.raises(UsageError, match="expected awskms://\\[ENDPOINT\\]/KEY"):
        load_signer("awskms://alias-without-a-slash")
