"""A stand-in for a cloud KMS (no network here, and moto's KMS signs no Ed25519): a back end for
``trainledger.journal.keys.PluginSigner`` that holds one Ed25519 key per URI in this process's memory, as a service
would hold it on its side. ``...?fail=after-N`` makes every signature after the Nth raise, as a throttled or
unreachable service would."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_KEYS: dict[str, Ed25519PrivateKey] = {}


class _Service:
    def __init__(self, uri: str):
        base, _, query = uri.partition("?")
        self._key = _KEYS.setdefault(base, Ed25519PrivateKey.generate())
        self._left = None
        if query.startswith("fail=after-"):
            self._left = int(query[len("fail=after-"):])
        self.calls = 0

    def public_key(self) -> bytes:
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, message: bytes) -> bytes:
        self.calls += 1
        if self._left is not None and self.calls > self._left:
            raise ConnectionError("ThrottlingException: rate exceeded")
        return self._key.sign(message)


def backend(uri: str) -> _Service:
    return _Service(uri)
