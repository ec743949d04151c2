"""A key held by AWS KMS signs seals: the ``awskms://`` back end of :class:`~trainledger.journal.keys.PluginSigner`.

The URI is cosign's: ``awskms://[ENDPOINT]/KEY``, KEY a key id, ``alias/NAME`` or a key ARN (``awskms:///alias/run-42``;
an ENDPOINT such as ``kms.eu-west-1.amazonaws.com`` is reached over HTTPS). The key must be an asymmetric signing key
of the spec ``ECC_NIST_EDWARDS25519`` (``aws kms create-key --key-spec ECC_NIST_EDWARDS25519 --key-usage
SIGN_VERIFY``); each seal is one ``Sign`` call (``MessageType=RAW``, ``SigningAlgorithm=ED25519_SHA_512``: plain
Ed25519 over the checkpoint text, as a key file signs it). Credentials, region and retries are boto3's own (its
environment, profile or instance role; ``AWS_ENDPOINT_URL_KMS`` points it elsewhere). ``pip install
'trainledger[awskms]'`` brings boto3.

Rate: one signature per seal, a seal a second per journal by default; an account signs about 300 a second with such
keys, so under torchrun give the ranks keys certified by it (``rank_keys="ephemeral"``: one signature a round).
"""

from __future__ import annotations

from typing import Any

from trainledger.journal.errors import KeyFileError, UsageError

__all__ = ["aws_kms", "parse_awskms_uri", "ED25519_SPEC", "ED25519_ALGORITHM"]

ED25519_SPEC = "ECC_NIST_EDWARDS25519"
ED25519_ALGORITHM = "ED25519_SHA_512"


def parse_awskms_uri(uri: str) -> tuple[str | None, str]:
    """``(endpoint URL or None, key)`` of ``awskms://[ENDPOINT]/KEY``; :class:`UsageError` naming what is wrong."""
    if not uri.startswith("awskms://"):
        raise UsageError(f"{uri[:40]!r}: not an awskms:// URI")
    rest = uri[len("awskms://"):].split("?", 1)[0]
    endpoint, slash, key = rest.partition("/")
    if not slash or not key:
        raise UsageError(f"{uri[:80]}: expected awskms://[ENDPOINT]/KEY (a key id, alias/NAME or a key ARN), e.g. "
                         "awskms:///alias/run-42")
    return (f"https://{endpoint}" if endpoint else None), key


class _AwsKms:
    """The back end PluginSigner drives: ``public_key()`` and ``sign(message)``."""

    def __init__(self, uri: str):
        try:
            import boto3
        except ImportError:
            raise UsageError("an awskms:// key needs boto3: pip install 'trainledger[awskms]'") from None
        self.endpoint, self.key = parse_awskms_uri(uri)
        kw = {"endpoint_url": self.endpoint} if self.endpoint else {}
        self.client = boto3.client("kms", **kw)

    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        got = self.client.get_public_key(KeyId=self.key)
        spec = got.get("KeySpec")
        if spec != ED25519_SPEC or got.get("KeyUsage", "SIGN_VERIFY") != "SIGN_VERIFY":
            raise KeyFileError(f"awskms key {self.key}: a {spec} key for {got.get('KeyUsage')}, not an Ed25519 "
                               f"signing key (aws kms create-key --key-spec {ED25519_SPEC} --key-usage SIGN_VERIFY)")
        pub = serialization.load_der_public_key(bytes(got["PublicKey"]))
        if not isinstance(pub, Ed25519PublicKey):
            raise KeyFileError(f"awskms key {self.key}: its public key is not an Ed25519 key")
        return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, message: bytes) -> bytes:
        got = self.client.sign(KeyId=self.key, Message=message, MessageType="RAW",
                               SigningAlgorithm=ED25519_ALGORITHM)
        return bytes(got["Signature"])


def aws_kms(uri: str) -> Any:
    """The ``awskms`` back end (the entry point ``trainledger_signers: awskms``)."""
    return _AwsKms(uri)
