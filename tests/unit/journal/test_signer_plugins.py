"""Keys held by a service (a cloud KMS) sign through a back end registered for their URI scheme. No KMS is reachable
here and moto's KMS signs no Ed25519, so the back end is a stand-in (tests/helpers/fake_kms.py) holding the key in
memory: what is tested is the protocol, the checks around it and the journal it signs."""

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
    with pytest.raises(UsageError, match="no signing back end for awskms is installed"):
        load_signer("awskms:///alias/run")
    monkeypatch.setenv("TRAINLEDGER_SIGNER_PLUGINS", "awskms=no_such_module:backend")
    with pytest.raises(UsageError, match="cannot be loaded"):
        load_signer("awskms:///alias/run")
    monkeypatch.setenv("TRAINLEDGER_SIGNER_PLUGINS", PLUGINS)
    signer = load_signer("awskms:///alias/flaky?fail=after-1")
    signer.sign(b"one")
    with pytest.raises(KeyFileError, match="signing failed: ConnectionError: ThrottlingException"):
        signer.sign(b"two")
    assert "fail=" not in repr(signer)  # the URI's query is not shown
