"""trainledger's torch-free core: the hash-chained, Ed25519-signed event journal.

Importing this package never imports torch; the ``trainledger`` CLI's
``keygen``, ``verify``, ``head``, ``show`` and ``demo`` run without it.
"""

__version__ = "0.2.0"

from trainledger.journal.codec import UnknownEvent, decode_line, encode_event, encode_record
from trainledger.journal.errors import (
    ChainBroken,
    HeadMismatch,
    IntegrityError,
    JournalClosed,
    TrainledgerError,
    UnsafePath,
    JournalError,
    JournalIOError,
    JournalLocked,
    KeyFileError,
    NonCanonicalRecord,
    NotClosed,
    RunMismatch,
    SchemaError,
    SealInvalid,
    SequenceError,
    UnsealedEvents,
    UnsignedJournal,
    UnsupportedFormat,
    UntrustedKey,
    UsageError,
)
from trainledger.journal.events import FORMAT_VERSION, Event, RunClosed, RunOpened, RunResumed, Seal, StepObserved, TailRepaired
from trainledger.journal.keys import PublicKey, Signer, keygen, load_public_key, load_signer, trusted_keys
from trainledger.journal.reader import read_events, read_signed_events
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import VerifyReport, parse_head, verify
from trainledger.journal.writer import Journal

__all__ = [
    "__version__",
    "Journal",
    "verify",
    "VerifyReport",
    "TrustPolicy",
    "parse_head",
    "read_events",
    "read_signed_events",
    "Signer",
    "PublicKey",
    "keygen",
    "load_signer",
    "load_public_key",
    "trusted_keys",
    "Event",
    "RunOpened",
    "Seal",
    "StepObserved",
    "RunResumed",
    "TailRepaired",
    "RunClosed",
    "UnknownEvent",
    "FORMAT_VERSION",
    "encode_event",
    "encode_record",
    "decode_line",
    "JournalError",
    "UsageError",
    "JournalIOError",
    "KeyFileError",
    "JournalLocked",
    "JournalClosed",
    "TrainledgerError",
    "UnsafePath",
    "UnsupportedFormat",
    "IntegrityError",
    "NonCanonicalRecord",
    "SchemaError",
    "ChainBroken",
    "SequenceError",
    "SealInvalid",
    "RunMismatch",
    "UntrustedKey",
    "UnsealedEvents",
    "UnsignedJournal",
    "NotClosed",
    "HeadMismatch",
]
