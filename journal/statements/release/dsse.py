"""DSSE envelopes in Sigstore bundles, as OpenSSF model signing writes and reads them with a key (no transparency
log): ``{"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": {"publicKey": {"hint": ...}, "tlogEntries": []},
"dsseEnvelope": {"payload": b64, "payloadType": "application/vnd.in-toto+json", "signatures": [{"sig": b64}]}}``;
the signature is over DSSE's pre-authentication encoding of the payload (PAE)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from trainledger.journal.errors import IntegrityError
from trainledger.journal.statements.release.keys import ReleaseKey, ReleasePublicKey

__all__ = ["PAYLOAD_TYPE", "BUNDLE_MEDIA_TYPE", "STATEMENT_TYPE", "MAX_BUNDLE_BYTES", "pae", "sign_statement",
           "open_bundle", "ReleaseSignatureError"]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: A signature or provenance file bigger than this is refused before it is parsed
MAX_BUNDLE_BYTES = 64 << 20


class ReleaseSignatureError(IntegrityError):
    """A model signature or provenance that does not hold (exit 1)."""

    reason = "release"


def pae(payload: bytes, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """DSSE v1's pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign_statement(statement: dict[str, Any], key: ReleaseKey) -> dict[str, Any]:
    """The Sigstore bundle of ``statement`` signed with ``key``."""
    payload = json.dumps(statement, separators=(",", ":"), sort_keys=True).encode()
    sig = key.sign(pae(payload))
    return {"mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": key.public.hint}, "tlogEntries": []},
            "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                             "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}


def _b64(v: Any, what: str, where: str) -> bytes:
    if not isinstance(v, str):
        raise ReleaseSignatureError(f"{where}: {what} is not a base64 string")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise ReleaseSignatureError(f"{where}: {what} is not base64") from None


def open_bundle(data: bytes, keys: list[ReleasePublicKey], where: str) -> tuple[dict[str, Any], ReleasePublicKey]:
    """The statement a bundle signs, and the pinned key that signed it. Raises :class:`ReleaseSignatureError`
    naming what is wrong: not a bundle, signed by no pinned key, a signature that does not verify, not an in-toto
    statement."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise ReleaseSignatureError(f"{where}: {len(data):,} bytes, over the {MAX_BUNDLE_BYTES:,} a bundle may hold")
    try:
        b = json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise ReleaseSignatureError(f"{where}: not JSON") from None
    if not isinstance(b, dict) or b.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise ReleaseSignatureError(f"{where}: not a Sigstore bundle ({BUNDLE_MEDIA_TYPE})")
    env = b.get("dsseEnvelope")
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE:
        raise ReleaseSignatureError(f"{where}: no DSSE envelope of an in-toto statement")
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs or not isinstance(sigs[0], dict):
        raise ReleaseSignatureError(f"{where}: the envelope has no signature")
    payload = _b64(env.get("payload"), "the payload", where)
    sig = _b64(sigs[0].get("sig"), "the signature", where)
    vm = b.get("verificationMaterial")
    hint = vm.get("publicKey", {}).get("hint") if isinstance(vm, dict) and isinstance(vm.get("publicKey"), dict) \
        else None
    if not keys:
        raise ReleaseSignatureError(f"{where}: no release key pinned (--release-key FILE): a signature checked "
                                    "against the key it names itself proves nothing")
    candidates = [k for k in keys if k.hint == hint] or (keys if hint in (None, "") else [])
    if not candidates:
        raise ReleaseSignatureError(f"{where}: signed by key {str(hint)[:16]}, which is not a pinned release key "
                                    f"(pinned: {', '.join(k.key_id for k in keys)})")
    signer = next((k for k in candidates if k.verify(sig, pae(payload))), None)
    if signer is None:
        raise ReleaseSignatureError(f"{where}: the signature does not verify under release key "
                                    f"{candidates[0].key_id}")
    try:
        st = json.loads(payload)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise ReleaseSignatureError(f"{where}: the signed payload is not JSON") from None
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise ReleaseSignatureError(f"{where}: the signed payload is not an in-toto statement v1")
    return st, signer
