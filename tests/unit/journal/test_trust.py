"""TrustPolicy: one value for what a reader calls verified, checked when it is made, the same as the keywords."""

from __future__ import annotations

import pytest

from trainledger import TrustPolicy
from trainledger.journal import Signer, UnsealedEvents, UntrustedKey, UsageError, verify


def test_the_default_trusts_nothing(make_journal):
    p = make_journal(20)
    with pytest.raises(UsageError, match="no key"):  # fail closed: a signed journal needs a pinned key
        verify(p, trust=TrustPolicy())


def test_a_policy_is_what_the_keywords_are(make_journal, pubkey):
    p = make_journal(20)
    by_policy = verify(p, trust=TrustPolicy(keys=[pubkey], require_closed=True))
    by_keywords = verify(p, keys=[pubkey], require_closed=True)
    assert by_policy.to_dict() == by_keywords.to_dict() and by_policy.trust == "pinned"


def test_keywords_on_top_of_a_policy_override_it(tmp_path, signer, pubkey):
    from conftest import step

    from trainledger.journal import Journal

    live = tmp_path / "live.jsonl"
    j = Journal.create(live, signer=signer, seal_every=10, background=False)
    for i in range(15):
        j.append(step(i))
    j.flush()  # on disk, the last events after the last seal: a live run as a reader sees it
    p = tmp_path / "copy.jsonl"
    p.write_bytes(live.read_bytes())
    j.close()
    policy = TrustPolicy(keys=[pubkey])
    with pytest.raises(UnsealedEvents):
        verify(p, trust=policy)
    assert verify(p, trust=policy, allow_unsealed=True).unsealed_events > 0
    assert policy.allow_unsealed is False  # the policy itself is frozen


def test_a_foreign_key_is_refused_under_a_policy(make_journal):
    p = make_journal(5)
    with pytest.raises(UntrustedKey):
        verify(p, trust=TrustPolicy(keys=(Signer.generate().public,)))


@pytest.mark.parametrize("bad, match", [
    ({"keys": "trainledger.pub"}, "keys must be public keys"),
    ({"keys": [b"\x00" * 32]}, "keys must be public keys"),
    ({"allow_unsealed": "yes"}, "allow_unsealed must be True or False"),
    ({"expect_head": "12:nothex"}, "expected SEQ:HASH"),
    ({"expect_head": (1, 2, 3)}, "expect_head must be"),
])
def test_a_bad_value_is_a_usage_error_when_the_policy_is_made(bad, match):
    with pytest.raises(UsageError, match=match):
        TrustPolicy(**bad)


def test_an_unknown_option_is_named(make_journal, pubkey):
    with pytest.raises(UsageError, match="unknown option.*allow_everything"):
        verify(make_journal(3), keys=[pubkey], allow_everything=True)


def test_a_head_given_as_text_is_parsed_once(make_journal, pubkey):
    p = make_journal(10)
    head = verify(p, keys=[pubkey]).head
    policy = TrustPolicy(keys=[pubkey], expect_head=head)
    assert policy.expect_head == (int(head.split(":")[0]), head.split(":")[1])
    assert verify(p, trust=policy).ok
    assert "1 pinned key(s)" in policy.describe() and "head" in policy.describe()
