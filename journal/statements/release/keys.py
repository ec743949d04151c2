"""The release key: ECDSA P-256, PEM files, the only kind OpenSSF model signing's key flows accept (its
``model_signing verify key`` takes P-256, P-384 or P-521; cosign and Rekor v2 take no pure Ed25519). The run's
Ed25519 key keeps signing the journal's seals; this one signs what is released from it.

A key is known by its *hint*, the SHA-256 of its public key's PEM (SubjectPublicKeyInfo), which model signing
records in a bundle's ``verificationMaterial.publicKey.hint``; ``key_id`` is its first 16 hex digits."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trainledger.journal.errors import KeyFileError
from trainledger.journal.keys import read_small_file
from trainledger.journal.paths import write_atomically

__all__ = ["ReleaseKey", "ReleasePublicKey", "Pkcs11ReleaseKey", "load_release_key", "load_release_public_key",
           "generate_release_key", "generate_pkcs11_release_key", "public_path"]

_CURVES = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}
_MAX_KEY_FILE = 64 << 10


def _hash_for(key: ec.EllipticCurvePublicKey):
    name = key.curve.name
    if name not in _CURVES:
        raise KeyFileError(f"an ECDSA key on {name}: a release key is P-256, P-384 or P-521")
    return _CURVES[name]()


class ReleasePublicKey:
    """A release key's public half."""

    def __init__(self, key: ec.EllipticCurvePublicKey):
        self._key = key
        self._hash = _hash_for(key)
        self.pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.hint = hashlib.sha256(self.pem).hexdigest()
        self.key_id = self.hint[:16]

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            self._key.verify(signature, data, ec.ECDSA(self._hash))
            return True
        except (InvalidSignature, ValueError):
            return False

    def __repr__(self) -> str:
        return f"ReleasePublicKey(key_id={self.key_id!r})"


class ReleaseKey:
    """A release key's private half (signs a model's signature and provenance)."""

    def __init__(self, key: ec.EllipticCurvePrivateKey):
        self._key = key
        self.public = ReleasePublicKey(key.public_key())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data, ec.ECDSA(self.public._hash))

    @classmethod
    def generate(cls) -> ReleaseKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    def save(self, path: str | os.PathLike, *, exist_ok: bool = False) -> tuple[Path, Path]:
        """Write the private key (PKCS#8 PEM, mode 0600, never over an existing file) and its public key beside it
        (``release.key`` -> ``release.pub``; a name without ``.key`` gets ``.pub`` added)."""
        priv = Path(path)
        pub = public_path(priv)
        if exist_ok and priv.exists() and pub.exists():
            if load_release_key(priv).public.hint == load_release_public_key(pub).hint == self.public.hint:
                return priv, pub
        pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        try:
            fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyFileError(f"{priv}: exists; a release key is never overwritten (remove it first)") from None
        except OSError as e:
            raise KeyFileError(f"{priv}: cannot be written ({e.strerror or e})") from None
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        write_atomically(pub, self.public.pem)
        return priv, pub


def public_path(private: str | os.PathLike) -> Path:
    """Where a release key's public half lives: ``release.key`` -> ``release.pub``."""
    p = Path(private)
    return p.with_suffix(".pub") if p.suffix == ".key" else p.with_name(p.name + ".pub")


def generate_release_key(path: str | os.PathLike, *, exist_ok: bool = False) -> ReleaseKey:
    """A new P-256 release key written to ``path`` and ``path.pub`` (see :meth:`ReleaseKey.save`)."""
    p = Path(path)
    if exist_ok and p.exists():
        return load_release_key(p)
    k = ReleaseKey.generate()
    k.save(p)
    return k


class Pkcs11ReleaseKey(ReleaseKey):
    """A P-256 release key inside a PKCS#11 token (``pkcs11:token=...;object=...``, as a run key's URI): it signs
    there (CKM_ECDSA over the SHA-256 of the data; the raw r||s made DER, as model signing expects), each signature
    checked against the public key; nothing to save or export."""

    def __init__(self, uri: str):  # noqa: D107 - no ReleaseKey.__init__: the private key is the token's
        import threading

        from pkcs11 import Attribute, KeyType, ObjectClass

        from trainledger.journal.backends.hsm import open_session, shown_uri

        self.uri = shown_uri(uri)
        pkcs11, attrs, self._session = open_session(uri)
        label = attrs["object"]
        try:
            self._key = self._session.get_key(object_class=ObjectClass.PRIVATE_KEY, key_type=KeyType.EC, label=label)
            pub = self._session.get_key(object_class=ObjectClass.PUBLIC_KEY, key_type=KeyType.EC, label=label)
            point = bytes(pub[Attribute.EC_POINT])
        except (pkcs11.exceptions.PKCS11Error, pkcs11.exceptions.NoSuchKey,
                pkcs11.exceptions.MultipleObjectsReturned) as e:
            self._session.close()
            raise KeyFileError(f"{self.uri}: no single ECDSA key pair labelled {label!r} in the token "
                               f"({type(e).__name__}; trainledger keygen --release --pkcs11 makes one)") from None
        if len(point) == 67 and point[:2] == b"\x04\x41":  # a DER OCTET STRING around the uncompressed point
            point = point[2:]
        try:
            self.public = ReleasePublicKey(ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point))
        except ValueError:
            self._session.close()
            raise KeyFileError(f"{self.uri}: the token's key {label!r} is not an ECDSA P-256 key") from None
        self._lock = threading.Lock()

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
        from pkcs11 import Mechanism
        from pkcs11.exceptions import PKCS11Error

        with self._lock:
            try:
                # CKM_ECDSA over the SHA-256 digest made here (tokens such as SoftHSM have no CKM_ECDSA_SHA256)
                raw = bytes(self._key.sign(hashlib.sha256(data).digest(), mechanism=Mechanism.ECDSA))
            except PKCS11Error as e:
                raise KeyFileError(f"{self.uri}: signing failed ({type(e).__name__})") from None
        sig = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
        if len(raw) != 64 or not self.public.verify(sig, data):
            raise KeyFileError(f"{self.uri}: the token's signature does not verify under its public key")
        return sig

    def save(self, path: str | os.PathLike, *, exist_ok: bool = False) -> tuple[Path, Path]:
        raise KeyFileError(f"{self.uri}: the release key lives in the token and cannot be written to a file")

    def __repr__(self) -> str:
        return f"Pkcs11ReleaseKey(key_id={self.public.key_id!r}, uri={self.uri!r})"


def generate_pkcs11_release_key(uri: str) -> ReleasePublicKey:
    """Make an ECDSA P-256 key pair inside the token, labelled by the URI's ``object`` (private: sensitive, never
    extractable); refuses a label already used."""
    from pkcs11 import Attribute, KeyType, ObjectClass
    from pkcs11.util.ec import encode_named_curve_parameters

    from trainledger.journal.backends.hsm import open_session, shown_uri

    pkcs11, attrs, session = open_session(uri, rw=True)
    try:
        label = attrs["object"]
        if list(session.get_objects({Attribute.LABEL: label, Attribute.CLASS: ObjectClass.PRIVATE_KEY})):
            raise KeyFileError(f"{shown_uri(uri)}: the token already holds a key labelled {label!r}; a key is never "
                               "replaced (choose another object=)")
        try:
            session.generate_keypair(KeyType.EC, store=True, label=label,
                                     public_template={Attribute.EC_PARAMS:
                                                      encode_named_curve_parameters("1.2.840.10045.3.1.7")},
                                     private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        except pkcs11.exceptions.PKCS11Error as e:
            raise KeyFileError(f"{shown_uri(uri)}: the token cannot make an ECDSA P-256 key ({type(e).__name__})") \
                from None
    finally:
        session.close()
    return Pkcs11ReleaseKey(uri).public


def load_release_key(path: str | os.PathLike, password: bytes | None = None) -> ReleaseKey:
    """The release key at ``path``: a PEM file, or a ``pkcs11:`` URI naming a P-256 key in a token."""
    if str(path).startswith("pkcs11:"):
        return Pkcs11ReleaseKey(str(path))
    p = Path(path)
    data = read_small_file(p, "release key", limit=_MAX_KEY_FILE)  # a FIFO or a device is refused, not read
    if os.name == "posix" and os.stat(p).st_mode & 0o077:
        raise KeyFileError(f"{p}: the release key is readable by others (chmod 600 {p})")
    try:
        key = serialization.load_pem_private_key(data, password)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{p}: not a PEM private key ({str(e).splitlines()[0] if str(e) else 'unreadable'})") \
            from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KeyFileError(f"{p}: a {type(key).__name__.lstrip('_')}, not an ECDSA key: a release key is ECDSA P-256 "
                           "(trainledger keygen --release)")
    _hash_for(key.public_key())
    return ReleaseKey(key)


def load_release_public_key(path: str | os.PathLike) -> ReleasePublicKey:
    p = Path(path)
    data = read_small_file(p, "release public key", limit=_MAX_KEY_FILE)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise KeyFileError(f"{p}: not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeyFileError(f"{p}: not an ECDSA public key: a release key is ECDSA P-256 "
                           "(its .pub from trainledger keygen --release)")
    return ReleasePublicKey(key)
