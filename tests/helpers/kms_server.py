"""A stand-in for the AWS KMS service on 127.0.0.1, for the awskms:// back end's tests (journal/backends/kms.py): no KMS is
reachable here and moto's KMS has no Ed25519 keys. It speaks the service's JSON 1.1 protocol for the two calls a
signer makes (GetPublicKey, Sign), so that the test drives boto3's real client over real HTTP; it holds Ed25519
keys in memory by alias, checks each Sign request is what KMS requires for such a key, and can throttle."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


class KmsStandIn:
    def __init__(self):
        self.keys = {"alias/run-42": Ed25519PrivateKey.generate(), "alias/p256": generate_private_key(SECP256R1())}
        self.requests: list[tuple[str, dict]] = []
        self.throttle = False
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                action = self.headers.get("X-Amz-Target", "").split(".")[-1]
                stand_in.requests.append((action, body))
                code, out = stand_in.answer(action, body)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, action: str, body: dict) -> tuple[int, dict]:
        if self.throttle:
            return 400, {"__type": "ThrottlingException", "message": "Rate exceeded"}
        key = self.keys.get(body.get("KeyId"))
        if key is None:
            return 400, {"__type": "NotFoundException", "message": f"Alias {body.get('KeyId')} is not found."}
        ed = isinstance(key, Ed25519PrivateKey)
        if action == "GetPublicKey":
            der = key.public_key().public_bytes(serialization.Encoding.DER,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
            return 200, {"KeyId": body["KeyId"], "PublicKey": base64.b64encode(der).decode(),
                         "KeySpec": "ECC_NIST_EDWARDS25519" if ed else "ECC_NIST_P256", "KeyUsage": "SIGN_VERIFY",
                         "SigningAlgorithms": ["ED25519_SHA_512"] if ed else ["ECDSA_SHA_256"]}
        if action == "Sign":
            msg = base64.b64decode(body["Message"])
            if not ed or body.get("SigningAlgorithm") != "ED25519_SHA_512" or body.get("MessageType") != "RAW" \
                    or len(msg) > 4096:
                return 400, {"__type": "ValidationException", "message": "not a valid Ed25519 RAW sign request"}
            return 200, {"KeyId": body["KeyId"], "Signature": base64.b64encode(key.sign(msg)).decode(),
                         "SigningAlgorithm": "ED25519_SHA_512"}
        return 400, {"__type": "UnsupportedOperationException", "message": action}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
