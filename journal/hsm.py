"""Keys held in hardware: an Ed25519 key inside a PKCS#11 token (a YubiHSM, a cloud HSM, SoftHSM), named by an
RFC 7512 URI, signs the journal's seals; its private half never leaves the token and no file on the training node
holds it. The journal format does not change: a seal signed in the token verifies exactly like one signed from a
file, under the public key exported once (``trainledger keygen --pkcs11 URI``, ``trainledger pubkey URI``).

The URI: ``pkcs11:token=LABEL;object=KEYLABEL?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin``.
The module path may come from ``$TRAINLEDGER_PKCS11_MODULE`` instead, the PIN from ``pin-source`` (a file: URI) or
``$TRAINLEDGER_PKCS11_PIN``; a ``pin-value`` in the URI is refused (a command line is visible to every user of the
machine). Needs ``python-pkcs11`` (``pip install 'trainledger[pkcs11]'``)."""

from __future__ import annotations

from trainledger.journal.keys import (KMS_SCHEMES, MODULE_ENV, PIN_ENV, PKCS11_SCHEME, Pkcs11Signer,  # noqa: F401
                                      generate_pkcs11_key, is_key_uri, parse_pkcs11_uri, public_key_of)

__all__ = ["PKCS11_SCHEME", "KMS_SCHEMES", "Pkcs11Signer", "parse_pkcs11_uri", "generate_pkcs11_key",
           "public_key_of", "is_key_uri", "MODULE_ENV", "PIN_ENV"]
