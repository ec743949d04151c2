"""A real RFC 3161 time-stamping authority for the tests: Debian's ``openssl ts -reply`` behind a loopback HTTP
endpoint (``application/timestamp-query`` in, ``application/timestamp-reply`` out), with a CA and a TSA certificate
made by ``openssl req``/``x509`` (extended key usage timeStamping, critical).

    tsa = OpensslTsa(tmp_path / "tsa")      # the keys, the certificates and the config
    url = tsa.start()                       # http://127.0.0.1:PORT/
    ...
    tsa.stop()
"""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CONFIG = """
[ tsa ]
default_tsa = tsa_config1
[ tsa_config1 ]
dir = {dir}
serial = $dir/tsaserial
crypto_device = builtin
signer_cert = $dir/tsa.crt
certs = $dir/tsa.crt
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class OpensslTsa:
    def __init__(self, folder: Path, *, eku: bool = True):
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "ca.key", "-out", "ca.crt", "-subj", "/CN=trainledger test TSA CA", "-days", "3650", "-addext",
             "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tsa.key", "-out", "tsa.csr", "-subj",
             "/CN=trainledger test TSA", cwd=folder)
        (folder / "ext.cnf").write_text("extendedKeyUsage=critical,timeStamping\n" if eku else
                                        "keyUsage=digitalSignature\n")
        _run("x509", "-req", "-in", "tsa.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "tsa.crt", "-days", "3650", "-extfile", "ext.cnf", cwd=folder)
        (folder / "tsaserial").write_text("01\n")
        (folder / "tsa.cnf").write_text(CONFIG.format(dir=folder))
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()
        self.requests = 0

    def reply(self, query: bytes) -> bytes:
        with self._lock:  # openssl's serial file is not shared safely
            (self.dir / "q.tsq").write_bytes(query)
            _run("ts", "-reply", "-config", "tsa.cnf", "-queryfile", "q.tsq", "-out", "r.tsr", cwd=self.dir)
            self.requests += 1
            return (self.dir / "r.tsr").read_bytes()

    def start(self) -> str:
        tsa = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    out = tsa.reply(body)
                except subprocess.CalledProcessError:  # openssl refused (a certificate not for time stamping)
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def openssl_verify(self, note: bytes, token: bytes) -> subprocess.CompletedProcess:
        """``openssl ts -verify`` of a token (a ContentInfo) over ``note``, against the CA."""
        (self.dir / "note.bin").write_bytes(note)
        (self.dir / "token.der").write_bytes(token)
        return subprocess.run(["openssl", "ts", "-verify", "-data", "note.bin", "-in", "token.der", "-token_in",
                               "-CAfile", "ca.crt", "-untrusted", "tsa.crt"], cwd=self.dir, capture_output=True,
                              text=True, timeout=60)
