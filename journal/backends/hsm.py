"""Keys held in hardware: an Ed25519 key inside a PKCS#11 token (a YubiHSM, a cloud HSM, SoftHSM), named by an
RFC 7512 URI, signs the journal's seals; its private half never leaves the token and no file on the training node
holds it. The journal format does not change: a seal signed in the token verifies exactly like one signed from a
file, under the public key exported once (``trainledger keygen --pkcs11 URI``, ``trainledger pubkey URI``).

The URI: ``pkcs11:token=LABEL;object=KEYLABEL?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin``.
The module path may come from ``$TRAINLEDGER_PKCS11_MODULE`` instead, the PIN from ``pin-source`` (a file: URI) or
``$TRAINLEDGER_PKCS11_PIN``; a ``pin-value`` in the URI is refused (a command line is visible to every user of the
machine). Needs ``python-pkcs11`` (``pip install 'trainledger[pkcs11]'``)."""

from __future__ import annotations

import os
import threading
import urllib.parse
from pathlib import Path

from trainledger.journal.errors import KeyFileError, UsageError
from trainledger.journal.keys import (KMS_SCHEMES, PKCS11_SCHEME, PublicKey, Signer, is_key_uri,  # noqa: F401
                                      read_small_file)

__all__ = ["PKCS11_SCHEME", "KMS_SCHEMES", "Pkcs11Signer", "parse_pkcs11_uri", "generate_pkcs11_key",
           "public_key_of", "is_key_uri", "open_session", "shown_uri", "MODULE_ENV", "PIN_ENV"]

MODULE_ENV = "TRAINLEDGER_PKCS11_MODULE"
PIN_ENV = "TRAINLEDGER_PKCS11_PIN"
_ED25519_PARAMS = bytes.fromhex("06032b6570")  # DER of the OID 1.3.101.112 (id-Ed25519)
_MAX_PIN = 256


def parse_pkcs11_uri(uri: str) -> dict[str, str]:
    """The URI's path attributes (token, object, id, serial, ...) and its query (module-path, pin-source), decoded.
    Raises :class:`UsageError` naming what is wrong."""
    if not uri.startswith(PKCS11_SCHEME):
        raise UsageError(f"{uri[:40]!r}: not a pkcs11: URI")
    body = uri[len(PKCS11_SCHEME):]
    path, _, query = body.partition("?")
    out: dict[str, str] = {}
    for part, sep in ((path, ";"), (query, "&")):
        for item in filter(None, part.split(sep)):
            k, eq, v = item.partition("=")
            if not eq:
                raise UsageError(f"pkcs11 URI: {item[:40]!r} is not NAME=VALUE")
            k = k.strip().lower()
            if k in out:
                raise UsageError(f"pkcs11 URI: {k} given twice")
            out[k] = urllib.parse.unquote(v)
    if "pin-value" in out:
        raise UsageError("pkcs11 URI: pin-value is refused (a command line is visible to every user of the machine): "
                         f"use pin-source=file:/path or ${PIN_ENV}")
    if "object" not in out:
        raise UsageError("pkcs11 URI: name the key with object=LABEL")
    if "token" not in out and "serial" not in out:
        raise UsageError("pkcs11 URI: name the token with token=LABEL (or serial=)")
    return out


def _module(attrs: dict[str, str]) -> str:
    m = attrs.get("module-path") or os.environ.get(MODULE_ENV)
    if not m:
        raise UsageError(f"pkcs11 URI: no module: add module-path=/path/to/lib.so or set ${MODULE_ENV}")
    if not os.path.isabs(m):  # a relative path would load a library from whatever folder the command runs in
        raise UsageError(f"pkcs11 URI: module-path {m[:80]!r} is not an absolute path; name the library by its full "
                         "path (/usr/lib/softhsm/libsofthsm2.so)")
    if not Path(m).is_file():
        raise KeyFileError(f"{m}: the PKCS#11 module is not there")
    return m


def _pin(attrs: dict[str, str]) -> str | None:
    src = attrs.get("pin-source")
    if src is not None:
        p = Path(src[len("file:"):] if src.startswith("file:") else src)
        data = read_small_file(p, "PIN file", limit=_MAX_PIN)
        if os.name == "posix" and p.stat().st_mode & 0o077:
            raise KeyFileError(f"{p}: the PIN file is readable by others (chmod 600 {p})")
        return data.decode("utf-8", "replace").strip()
    return os.environ.get(PIN_ENV)


def _pkcs11():
    try:
        import pkcs11
    except ImportError:
        raise UsageError("a pkcs11: key needs python-pkcs11: pip install 'trainledger[pkcs11]'") from None
    return pkcs11


#: Opening a token is tried this many times, 0.1 s apart and doubling: several processes opening one token at once
#: (the ranks of a job starting together) can find it busy or, with SoftHSM's file store, briefly not listed
_OPEN_TRIES = 5


def open_session(uri: str, *, rw: bool = False):
    """``(pkcs11, the URI's attributes, a session)`` on the token ``uri`` names (logged in with its PIN), retried a
    few times while the token is not there yet; :class:`KeyFileError` naming the URI (never its PIN) otherwise."""
    import time

    pkcs11 = _pkcs11()
    attrs = parse_pkcs11_uri(uri)
    module = _module(attrs)
    pin = _pin(attrs)
    kw = {"token_label": attrs["token"]} if "token" in attrs else {"token_serial": attrs["serial"].encode()}
    for attempt in range(_OPEN_TRIES):
        try:
            token = pkcs11.lib(module).get_token(**kw)
            try:
                session = token.open(user_pin=pin, rw=rw)
            except pkcs11.exceptions.UserAlreadyLoggedIn:  # the login is the token's, shared by this process's sessions
                session = token.open(rw=rw)
            return pkcs11, attrs, session
        except (pkcs11.exceptions.NoSuchToken, pkcs11.exceptions.PKCS11Error, RuntimeError) as e:
            if attempt + 1 < _OPEN_TRIES and not isinstance(e, (pkcs11.exceptions.PinIncorrect,
                                                                pkcs11.exceptions.PinLocked)):
                time.sleep(0.1 * 2 ** attempt)
                continue
            raise KeyFileError(f"{shown_uri(uri)}: cannot open the token ({type(e).__name__}"
                               f"{': ' + str(e) if str(e) else ''})") from None


def shown_uri(uri: str) -> str:
    """The URI as an error may show it: its path, without the query (no PIN source, no module)."""
    return uri.split("?", 1)[0]


def _public_of(pkcs11, session, label: str, uri: str) -> PublicKey:
    from pkcs11 import Attribute, KeyType, ObjectClass

    try:
        pub = session.get_key(object_class=ObjectClass.PUBLIC_KEY, key_type=KeyType.EC_EDWARDS, label=label)
        point = pub[Attribute.EC_POINT]
    except (pkcs11.exceptions.PKCS11Error, pkcs11.exceptions.NoSuchKey, pkcs11.exceptions.MultipleObjectsReturned) \
            as e:
        raise KeyFileError(f"{shown_uri(uri)}: no single Ed25519 public key labelled {label!r} in the token "
                           f"({type(e).__name__})") from None
    raw = bytes(point)
    if len(raw) == 34 and raw[:2] == b"\x04\x20":  # a DER OCTET STRING around the 32 bytes
        raw = raw[2:]
    return PublicKey(raw, source=shown_uri(uri))


class Pkcs11Signer(Signer):
    """Signs seals with an Ed25519 key inside a PKCS#11 token (one session, kept open; signing is serialized). A
    :class:`Signer` everywhere one is taken; it has no private bytes to give (:meth:`private_pem` refuses)."""

    __slots__ = ("uri", "_session", "_lock", "_mech", "_full")

    def __init__(self, uri: str):  # noqa: D107 - no Signer.__init__: there is no private key object here
        from pkcs11 import Mechanism

        self._full = uri  # kept to open the session again after the token went away (never shown)
        self.uri = shown_uri(uri)
        self._session, self._key, self.public = self._connect()
        self._lock = threading.Lock()
        self._mech = Mechanism.EDDSA

    def _connect(self):
        """A session on the token, its private key and its public key (a token plugged back in: the same key)."""
        from pkcs11 import KeyType, ObjectClass

        pkcs11, attrs, session = open_session(self._full)
        uri = self._full
        try:
            key = session.get_key(object_class=ObjectClass.PRIVATE_KEY, key_type=KeyType.EC_EDWARDS,
                                  label=attrs["object"])
        except (pkcs11.exceptions.PKCS11Error, pkcs11.exceptions.NoSuchKey,
                pkcs11.exceptions.MultipleObjectsReturned) as e:
            session.close()
            raise KeyFileError(f"{self.uri}: no single Ed25519 private key labelled {attrs['object']!r} in the token "
                               f"({type(e).__name__}; trainledger keygen --pkcs11 makes one)") from None
        return session, key, _public_of(pkcs11, session, attrs["object"], uri)

    def private_pem(self) -> bytes:
        raise KeyFileError(f"{self.uri}: the key lives in the token and cannot be exported")

    def sign(self, message: bytes) -> bytes:
        import pkcs11

        with self._lock:
            try:
                sig = bytes(self._key.sign(message, mechanism=self._mech))
            except pkcs11.exceptions.PKCS11Error as e:
                # the token went away (unplugged, its service restarted): open a session again, once, and go on if
                # it is back with the same key; else one line (the journal's signing thread retries later)
                first = type(e).__name__
                self.close()
                try:
                    session, key, public = self._connect()
                except KeyFileError as again:
                    raise KeyFileError(f"{self.uri}: signing failed ({first}); the token cannot be opened again: "
                                       f"{again}") from None
                if public.raw != self.public.raw:
                    session.close()
                    raise KeyFileError(f"{self.uri}: the token answers again with another key under that label "
                                       f"({public.key_id}, not {self.key_id})") from None
                self._session, self._key = session, key
                try:
                    sig = bytes(self._key.sign(message, mechanism=self._mech))
                except pkcs11.exceptions.PKCS11Error as e2:
                    raise KeyFileError(f"{self.uri}: signing failed ({type(e2).__name__})") from None
        if not self.public.verify(sig, message):  # a token that signs wrong is caught here, not by a verifier later
            raise KeyFileError(f"{self.uri}: the token's signature does not verify under its public key")
        return sig

    def close(self) -> None:
        try:
            self._session.close()
        except Exception:  # noqa: BLE001 - a token gone away cannot be closed either
            pass

    def __repr__(self) -> str:
        return f"Pkcs11Signer(key_id={self.key_id!r}, uri={self.uri!r})"


def generate_pkcs11_key(uri: str) -> PublicKey:
    """Make an Ed25519 key pair inside the token, labelled by the URI's ``object`` (private: sensitive, never
    extractable); refuses a label already used. Returns the public key."""
    pkcs11, attrs, session = open_session(uri, rw=True)
    from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass

    try:
        label = attrs["object"]
        found = list(session.get_objects({Attribute.LABEL: label, Attribute.CLASS: ObjectClass.PRIVATE_KEY}))
        if found:
            raise KeyFileError(f"{shown_uri(uri)}: the token already holds a key labelled {label!r}; a key is never "
                               "replaced (choose another object=)")
        try:
            session.generate_keypair(KeyType.EC_EDWARDS, mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN, store=True,
                                     label=label, public_template={Attribute.EC_PARAMS: _ED25519_PARAMS},
                                     private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        except pkcs11.exceptions.PKCS11Error as e:
            raise KeyFileError(f"{shown_uri(uri)}: the token cannot make an Ed25519 key ({type(e).__name__})") from None
        return _public_of(pkcs11, session, label, uri)
    finally:
        session.close()


def public_key_of(uri: str) -> PublicKey:
    """The public half of the key the URI names."""
    pkcs11, attrs, session = open_session(uri)
    try:
        return _public_of(pkcs11, session, attrs["object"], uri)
    finally:
        session.close()
