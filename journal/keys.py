"""Ed25519 keys: generation, loading with permission checks, key ids, trust lists.

Files written by :func:`keygen`:

- ``trainledger.key``: the private key, PKCS8 PEM, mode 0600. Loading one that
  group or others can read is refused, as ssh refuses such a key.
- ``trainledger.pub``: one line, ``trainledger-ed25519 <base64 raw key> <key id>``.

A key id is the first 16 hex digits of SHA-256 over the 32 raw public-key bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from trainledger.journal.paths import open_new, write_atomically
from trainledger.journal.errors import JournalIOError, KeyFileError, UsageError

__all__ = [
    "PluginSigner",
    "SIGNER_BACKENDS",
    "PKCS11_SCHEME",
    "KMS_SCHEMES",
    "is_key_uri",
    "PUBKEY_PREFIX",
    "TRUSTED_KEYS_ENV",
    "Signer",
    "PublicKey",
    "key_id_of",
    "keygen",
    "load_signer",
    "load_public_key",
    "parse_public_key",
    "trusted_keys",
    "KEY_DIR_ENV",
    "key_home",
    "run_key",
    "private_keys_in",
    "warn_private_keys",
]

PUBKEY_PREFIX = "trainledger-ed25519"
#: Environment variable naming a file of pinned public keys, one per line (like ssh's allowed_signers).
TRUSTED_KEYS_ENV = "TRAINLEDGER_TRUSTED_KEYS"
_MAX_KEY_FILE = 64 * 1024


# Encodings of the Ed25519 points of small order (libsodium's blocklist; the sign bit is ignored). Under such a
# key one fixed signature verifies for every message, so a journal "signed" by it proves nothing.
_SMALL_ORDER = {bytes.fromhex(h) for h in (
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
)}


def key_id_of(raw_public: bytes) -> str:
    """Short, stable identifier of a public key."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


class PublicKey:
    """A pinned Ed25519 public key."""

    __slots__ = ("raw", "key_id", "_key", "source")

    def __init__(self, raw: bytes, source: str = "<memory>"):
        if len(raw) != 32:
            raise KeyFileError(f"{source}: an Ed25519 public key is 32 bytes, got {len(raw)}")
        if raw[:31] + bytes([raw[31] & 0x7F]) in _SMALL_ORDER:
            raise KeyFileError(f"{source}: a small-order Ed25519 point, not a usable public key (one signature "
                               "would verify every message)")
        self.raw = raw
        self.key_id = key_id_of(raw)
        self._key = Ed25519PublicKey.from_public_bytes(raw)
        self.source = source

    def __reduce__(self):
        """Pickled as its 32 bytes (rebuilt, and checked again, where it is unpickled: a verification task's
        process)."""
        return (PublicKey, (self.raw, self.source))

    @property
    def b64(self) -> str:
        return base64.b64encode(self.raw).decode()

    def line(self) -> str:
        """The one-line text form written to ``.pub`` files."""
        return f"{PUBKEY_PREFIX} {self.b64} {self.key_id}"

    def verify(self, signature: bytes, message: bytes) -> bool:
        """Internal check used by the verifier, which turns False into :class:`SealInvalid`."""
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def __repr__(self) -> str:
        return f"PublicKey(key_id={self.key_id!r})"


def _serialization() -> Any:
    """cryptography's key serialization, for PEM files: loaded when one is read or written (its import, with the
    SSH formats it pulls in, is a sixth of a verify's start)."""
    from cryptography.hazmat.primitives import serialization

    return serialization


class Signer:
    """Signs seals with an Ed25519 private key."""

    __slots__ = ("_key", "public")

    def __init__(self, private_key: Ed25519PrivateKey):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError("Signer needs an Ed25519PrivateKey")
        self._key = private_key
        raw = private_key.public_key().public_bytes_raw()
        self.public = PublicKey(raw)

    @classmethod
    def generate(cls) -> Signer:
        """A fresh in-memory key (tests, throwaway runs)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Signer:
        return load_signer(path)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def private_pem(self) -> bytes:
        serialization = _serialization()
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def derived_seed(self, label: bytes) -> bytes:
        """32 bytes derived from this key (HKDF-SHA256 over its private bytes, ``label`` as the info): the seed of a
        second key that belongs with this one (a witness's ML-DSA-44 key beside its Ed25519 key), never the key
        itself. A key in a token or a KMS has no bytes to give: :class:`UsageError`."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        key = getattr(self, "_key", None)
        if not isinstance(key, Ed25519PrivateKey):
            raise UsageError(f"key {self.key_id}: held in a token or a KMS, it has no bytes to derive a second key from "
                             "(use a key file for this)")
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(key.private_bytes_raw())

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r})"


def read_small_file(path: Path, what: str, *, limit: int = _MAX_KEY_FILE) -> bytes:
    """A small regular file's bytes. A FIFO, a device (/dev/zero) or a folder is refused before it is read, and
    never more than ``limit`` bytes (a key file's cap by default) is read, so no such file can hang a command or
    exhaust its memory."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(f"{path}: {what} not found") from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read {what}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise KeyFileError(f"{path}: is a directory, expected a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path}: not a regular file, expected a {what} file")
    if st.st_size > limit:
        raise KeyFileError(f"{path}: too large to be a {what} ({st.st_size} bytes)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for something else since the stat above
                raise KeyFileError(f"{path}: not a regular file, expected a {what} file")
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read {what}: {e.strerror}") from None
    if len(data) > limit:
        raise KeyFileError(f"{path}: too large to be a {what}")
    return data


def load_signer(path: str | os.PathLike) -> Signer:
    """Load a private key written by :func:`keygen` (or any unencrypted PKCS8 Ed25519 PEM), or open the key an
    RFC 7512 ``pkcs11:`` URI names inside a token (:class:`trainledger.journal.backends.hsm.Pkcs11Signer`: the key never
    leaves it). Every ``key=`` and ``--key`` goes through here.

    Raises :class:`KeyFileError` if the file is missing, readable by group or
    others, a public key, encrypted, or not an Ed25519 key.
    """
    text = os.fspath(path)
    if isinstance(text, str) and text.startswith(PKCS11_SCHEME):
        return _load_target(SIGNER_BACKENDS["pkcs11"])(text)  # a Signer whose key stays in the token
    if isinstance(text, str) and _SCHEME.match(text):
        return PluginSigner(text)  # a KMS (awskms://, gcpkms://, ...) through the back end named for its scheme
    p = Path(path)
    data = read_small_file(p, "private key")
    if data.lstrip().startswith(PUBKEY_PREFIX.encode()) or b"PUBLIC KEY" in data:
        raise KeyFileError(f"{p}: this is a public key; signing needs the private key (trainledger.key)")
    mode = stat.S_IMODE(p.stat().st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"{p}: private key is accessible by group or others (mode {mode:04o}); run: chmod 600 {p}"
        )
    if b"ENCRYPTED" in data:
        raise KeyFileError(f"{p}: encrypted private keys are not supported")
    try:
        key = _serialization().load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{p}: not a PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{p}: not an Ed25519 key ({type(key).__name__})")
    return Signer(key)


def parse_public_key(text: str, source: str = "<text>") -> PublicKey:
    """Parse ``trainledger-ed25519 <base64> [comment]`` or a PEM public key."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        if "PRIVATE KEY" in stripped:
            raise KeyFileError(f"{source}: this is a private key; give the public key (trainledger.pub)")
        try:
            key = _serialization().load_pem_public_key(stripped.encode())
        except ValueError as e:
            raise KeyFileError(f"{source}: not a PEM public key ({e})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"{source}: not an Ed25519 public key")
        return PublicKey(key.public_bytes_raw(), source)
    parts = stripped.split()
    if len(parts) < 2 or parts[0] != PUBKEY_PREFIX:
        raise KeyFileError(f"{source}: not a public key (expected '{PUBKEY_PREFIX} <base64>')")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError(f"{source}: public key is not valid base64") from None
    pk = PublicKey(raw, source)
    if len(parts) >= 3 and len(parts[2]) == 16 and parts[2] != pk.key_id:
        raise KeyFileError(f"{source}: key id {parts[2]} does not match the key (computed {pk.key_id})")
    return pk


def load_public_key(path: str | os.PathLike) -> PublicKey:
    """Load a ``.pub`` file (one line) or a PEM public key."""
    p = Path(path)
    data = read_small_file(p, "public key")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{p}: not a text public key file") from None
    if not text.lstrip().startswith("-----BEGIN"):
        lines = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
        if len(lines) != 1:
            raise KeyFileError(f"{p}: holds {len(lines)} keys, expected exactly one (list several keys in a "
                               f"trusted-keys file, ${TRUSTED_KEYS_ENV})")
        text = lines[0]
    return parse_public_key(text, str(p))


def trusted_keys(paths: list[str] | tuple[str, ...] = (), *, env: dict[str, str] | None = None) -> list[PublicKey]:
    """The pinned keys: the ``--pubkey`` files when any are given (and then only those), else the keys in the
    file named by ``$TRAINLEDGER_TRUSTED_KEYS``. Each key's ``source`` says where it was pinned.

    The trusted-keys file holds one public key per line; blank lines and lines
    starting with ``#`` are ignored.
    """
    keys = [load_public_key(p) for p in paths]
    if keys:
        return keys  # explicit keys replace the team's list, never silently widened by it
    listing = (os.environ if env is None else env).get(TRUSTED_KEYS_ENV)
    if listing:
        p = Path(listing)
        data = read_small_file(p, "trusted-keys file")
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                keys.append(parse_public_key(line, f"{p}:{n}"))
    return keys


def keygen(directory: str | os.PathLike, *, name: str = "trainledger", force: bool = False,
           exist_ok: bool = False) -> tuple[Path, Path]:
    """Write ``NAME.key`` (0600) and ``NAME.pub`` into ``directory``; return both paths.

    Refuses to overwrite existing files unless ``force``. With ``exist_ok`` a pair already there is kept and
    returned (a script run again after a crash makes its key once): the private key must load and match the
    public one, else ``UsageError``. Warns (``UserWarning``) when the key lands inside a git work tree that does
    not ignore it: one ``git add`` from a commit.
    """
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise UsageError(f"{d}: exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JournalIOError(f"{d}: cannot create the key folder: {e.strerror}") from None
    priv, pub = d / f"{name}.key", d / f"{name}.pub"
    if exist_ok and not force and (priv.exists() or pub.exists()):
        if not (priv.is_file() and pub.is_file()):
            raise UsageError(f"{priv if not priv.is_file() else pub}: missing beside "
                             f"{pub if not priv.is_file() else priv}; a key pair is both files")
        if load_signer(priv).public.line() != load_public_key(pub).line():
            raise UsageError(f"{pub}: is not the public key of {priv}")
        _warn_if_tracked(priv)
        return priv, pub
    if not force:
        for p in (priv, pub):
            if p.exists():
                raise UsageError(f"{p}: already exists; refusing to overwrite a key (use --force)")
    signer = Signer.generate()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if force else os.O_EXCL) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(priv, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, signer.private_pem())
            os.fsync(fd)
        finally:
            os.close(fd)
        with open_new(pub.with_suffix(".pub.tmp")) as f:
            f.write((signer.public.line() + "\n").encode())
        os.replace(pub.with_suffix(".pub.tmp"), pub)
    except OSError as e:
        raise JournalIOError(f"{d}: cannot write the key pair there: {e.strerror}") from None
    _warn_if_tracked(priv)
    return priv, pub


def _warn_if_tracked(key: Path) -> None:
    """A ``UserWarning`` when ``key`` is inside a git work tree that does not ignore it (asked of git itself,
    ``git check-ignore``; no git, no warning)."""
    import subprocess
    import warnings

    here = key.resolve().parent
    if not any((p / ".git").exists() for p in (here, *here.parents)):
        return
    try:
        out = subprocess.run(["git", "-C", str(here), "check-ignore", "-q", str(key.resolve())],
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return
    if out.returncode == 1:  # 0: ignored; 128: not a work tree after all, or git failed
        warnings.warn(f"{key}: a private signing key inside a git work tree that does not ignore it; add its "
                      f"folder to .gitignore (one 'git add' would commit it)", UserWarning, stacklevel=3)


def private_keys_in(path: str | os.PathLike) -> list[Path]:
    """The private keys (``*.key`` files that start like a PEM private key) in the folder ``path`` is, or is in,
    not below it: a run folder that holds its own signing key. Reads at most 64 bytes of each candidate."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    found = []
    try:
        candidates = sorted(folder.glob("*.key"))[:100]
    except OSError:
        return []
    for k in candidates:
        try:
            if k.is_file() and not k.is_symlink():
                with open(k, "rb") as f:
                    head = f.read(64).lstrip()
                    if head.startswith(b"-----BEGIN") and b"PRIVATE KEY" in head:
                        found.append(k)
        except OSError:
            continue
    return found


def warn_private_keys(path: str | os.PathLike) -> None:
    """One warning line on stderr for each private key in the folder of ``path`` (see :func:`private_keys_in`)."""
    import sys

    for k in private_keys_in(path):
        sys.stderr.write(f"warning: {k} is a private signing key inside the run folder: whoever gets the folder "
                         "can sign as this run's writer; keep keys outside run folders (a reviewer needs only the "
                         "public key)\n")



#: where commands that make a run's key (``ladder``, ``demo``) keep it: outside the run folder
KEY_DIR_ENV = "TRAINLEDGER_KEY_DIR"


def key_home() -> Path:
    """``$TRAINLEDGER_KEY_DIR``, else ``$XDG_CONFIG_HOME/trainledger/keys``, else ``~/.config/trainledger/keys``."""
    env = os.environ.get(KEY_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainledger" / "keys"


#: the name of the key signing runs that name none (``Recorder``, ``import trainledger as wandb``): in :func:`key_home`
DEFAULT_KEY_NAME = "default"


def default_key() -> Path:
    """The private key of this user's runs that name none: ``key_home()/default.key``, made on first use (and its
    ``.pub`` beside it). Never inside a run folder; never overwritten."""
    priv, _ = keygen(key_home(), name=DEFAULT_KEY_NAME, exist_ok=True)
    return Path(priv)


def find_key(keys: Any, home: str | os.PathLike | None = None) -> Path | None:
    """The private key in :func:`key_home` (or ``home``) whose public key is one of ``keys``: where a run this user
    wrote keeps its key (the main job's, the Recorder's default). None when there is none; a file that is not a
    key this user alone can read is passed over, never an error."""
    want = {k.key_id for k in keys}
    folder = Path(home) if home is not None else key_home()
    if not want or not folder.is_dir():
        return None
    for f in sorted(folder.glob("*.key"))[:10_000]:
        try:
            if not f.is_file() or f.is_symlink():
                continue
            if load_signer(f).public.key_id in want:
                return f
        except (KeyFileError, OSError, ValueError):
            continue
    return None


def run_key(run_dir: str | os.PathLike, key: str | os.PathLike | None = None) -> tuple[Path | str, Path]:
    """The signing key of a run a command creates, kept outside the run folder, and its public key inside it.

    With ``key`` (a private key file, or a ``pkcs11:`` URI), that key; else a new one in :func:`key_home`, named after the run folder
    (``NAME-XXXXXX.key``, never overwriting). The public key goes into ``run_dir/trainledger.pub`` either way (a
    reviewer needs it; it signs nothing). Refuses a ``key`` inside ``run_dir``. Returns (private, public): the
    private one a path, or the URI."""
    import secrets

    run = Path(run_dir)
    if key is not None and (str(key).startswith("pkcs11:") or _SCHEME.match(str(key))):  # a token's, a service's
        priv: str | Path = str(key)  # the URI: load_signer opens it again
        signer = load_signer(priv)
    elif key is not None:
        k = Path(key)
        if k.resolve().parent == run.resolve() or k.resolve().is_relative_to(run.resolve()):
            raise UsageError(f"{k}: the signing key is inside the run folder {run}; keep it outside (whoever gets "
                             "the folder could sign as the run)")
        priv = k
        signer = load_signer(priv)
    else:
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in run.resolve().name)[:80] or "run"
        priv, _ = keygen(key_home(), name=f"{name}-{secrets.token_hex(3)}")
        signer = load_signer(priv)
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JournalIOError(f"{run}: cannot create the run folder: {e.strerror}") from None
    return priv, publish_key(run, signer.public)


def publish_key(run_dir: str | os.PathLike, public: Any) -> Path:
    """``run_dir/trainledger.pub``: the public key a reviewer verifies the run with, written atomically beside its
    journal (a failure to write it is a :class:`JournalIOError` naming the file)."""
    pub = Path(run_dir) / "trainledger.pub"
    try:
        write_atomically(pub, (public.line() + "\n").encode())
    except OSError as e:
        raise JournalIOError(f"{pub}: cannot write the public key: {e.strerror}") from None
    return pub


# ---------------------------------------------------------------- keys held by a service or in hardware
# The core knows signing back ends only by name: a URI's scheme picks one (SIGNER_BACKENDS, or a plugin of the
# user's), imported when a key names it; the back ends themselves live in journal/backends/ (docs/keys.md).

PKCS11_SCHEME = "pkcs11:"
#: cosign's KMS URI schemes: named so that a user gets a clear refusal, not "file not found"
KMS_SCHEMES = ("awskms://", "gcpkms://", "azurekms://", "hashivault://")
#: the back ends that ship, by scheme: ``module:callable`` taking the URI and returning a Signer-like back end
SIGNER_BACKENDS = {"pkcs11": "trainledger.journal.backends.hsm:Pkcs11Signer",
                   "awskms": "trainledger.journal.backends.kms:aws_kms"}


def _load_target(target: str) -> Any:
    """``package.module:callable``, imported."""
    import importlib

    mod, _, attr = target.partition(":")
    return getattr(importlib.import_module(mod), attr)


#: ``SCHEME://...``: a key held by a service, signed through a back end (:class:`PluginSigner`)
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{1,30}://")
#: ``awskms=package.module:factory,...``: the signing back ends, by URI scheme (docs/keys.md)
PLUGINS_ENV = "TRAINLEDGER_SIGNER_PLUGINS"


def _plugin_factory(scheme: str) -> Any:
    """The back end for ``scheme``: from ``$TRAINLEDGER_SIGNER_PLUGINS`` (``scheme=module:callable``, comma
    separated), else an installed package's entry point in the group ``trainledger_signers``, else for
    ``awskms`` the one that ships (:mod:`trainledger.journal.backends.kms`, boto3)."""
    for item in filter(None, (x.strip() for x in os.environ.get(PLUGINS_ENV, "").split(","))):
        name, eq, target = item.partition("=")
        if eq and name.strip() == scheme:
            if ":" not in target:
                raise UsageError(f"${PLUGINS_ENV}: {item[:60]!r} is not scheme=module:callable")
            try:
                return _load_target(target.strip())
            except (ImportError, AttributeError) as e:
                raise UsageError(f"${PLUGINS_ENV}: the {scheme} back end {target[:60]} cannot be loaded ({e})") \
                    from None
    from importlib.metadata import entry_points

    for ep in entry_points(group="trainledger_signers"):
        if ep.name == scheme:
            return ep.load()
    if scheme in SIGNER_BACKENDS and scheme != "pkcs11":  # awskms ships: through boto3 (journal/backends/kms.py)
        return _load_target(SIGNER_BACKENDS[scheme])
    known = " (cosign's KMS scheme)" if scheme + "://" in KMS_SCHEMES else ""
    raise UsageError(f"{scheme}:// keys{known}: no signing back end for {scheme} is installed; one registers as an "
                     f"entry point in the group trainledger_signers or in ${PLUGINS_ENV} (docs/keys.md); or use a "
                     "key file or a pkcs11: URI")


class PluginSigner(Signer):
    """Signs seals through a back end for a service-held key (a cloud KMS): the back end is a callable taking the
    URI and returning an object with ``public_key() -> bytes`` (the 32 raw bytes of the Ed25519 public key) and
    ``sign(message: bytes) -> bytes`` (the 64-byte Ed25519 signature). Every signature is checked against the
    public key before a seal carries it."""

    __slots__ = ("uri", "_backend", "_lock")

    def __init__(self, uri: str):  # noqa: D107 - the key is the service's: no Signer.__init__
        scheme = uri.split("://", 1)[0]
        self.uri = uri.split("?", 1)[0]
        try:
            self._backend = _plugin_factory(scheme)(uri)
            raw = bytes(self._backend.public_key())
        except (UsageError, KeyFileError):
            raise
        except Exception as e:  # noqa: BLE001 - a back end's own failure, named in one line
            raise KeyFileError(f"{self.uri}: the {scheme} back end failed: {type(e).__name__}: {str(e)[:200]}") \
                from None
        self.public = PublicKey(raw, source=self.uri)
        self._lock = threading.Lock()

    def private_pem(self) -> bytes:
        raise KeyFileError(f"{self.uri}: the key is held by the service and cannot be exported")

    def sign(self, message: bytes) -> bytes:
        with self._lock:
            try:
                sig = bytes(self._backend.sign(message))
            except Exception as e:  # noqa: BLE001 - a throttled or unreachable service: one line
                raise KeyFileError(f"{self.uri}: signing failed: {type(e).__name__}: {str(e)[:200]}") from None
        if not self.public.verify(sig, message):
            raise KeyFileError(f"{self.uri}: the service's signature does not verify under its public key")
        return sig

    def __repr__(self) -> str:
        return f"PluginSigner(key_id={self.key_id!r}, uri={self.uri!r})"


def is_key_uri(spec: Any) -> bool:
    s = str(spec)
    return s.startswith(PKCS11_SCHEME) or s.startswith(KMS_SCHEMES)


#: names that moved to journal/backends/hsm.py in 0.2.0, still readable here (with a DeprecationWarning)
_MOVED_TO_HSM = frozenset({"Pkcs11Signer", "generate_pkcs11_key", "public_key_of", "parse_pkcs11_uri", "MODULE_ENV",
                           "PIN_ENV"})


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_HSM:
        import warnings

        warnings.warn(f"trainledger.journal.keys.{name} is deprecated and goes away in 0.3: import {name} from "
                      "trainledger.journal.backends.hsm", DeprecationWarning, stacklevel=2)
        return _load_target(f"trainledger.journal.backends.hsm:{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
