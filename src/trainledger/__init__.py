"""trainledger: tamper-evident, replayable receipts for neural-network training runs.

The project's folders ``journal/`` (the torch-free event log), ``training/`` (torch) and ``ladder/`` (the
pilot ladder) are installed as ``trainledger.journal``, ``trainledger.training`` and ``trainledger.ladder``,
so that a user's own ``journal/`` or ``training/`` folder never shadows them. The names most users need are
re-exported here; the torch-side ones resolve on first use, so ``import trainledger`` works without torch::

    from trainledger import Journal, keygen, load_signer, verify
    from trainledger import TrainingHealthMonitor, run_pilot_ladder   # these need the torch extra
"""

from __future__ import annotations

import sys as _sys


def _interrupted_at_startup(*_: object) -> None:
    """Ctrl-C before a command has started: nothing to clean up, one line, exit 130 (never a traceback)."""
    import os

    _sys.stderr.write("trainledger: interrupted\n")
    _sys.stderr.flush()
    os._exit(130)


def _is_command() -> bool:
    """Whether this process is the ``trainledger`` command (the console script, or ``python -m trainledger``)."""
    import os

    a0 = _sys.argv[0] if _sys.argv else ""
    if os.path.basename(a0) == "trainledger" or a0.endswith(os.path.join("trainledger", "__main__.py")):
        return True
    argv = list(getattr(_sys, "orig_argv", ()))  # the interpreter's own options, then -m MODULE or a script
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return argv[i + 1:i + 2] == ["trainledger"]
        if a.startswith("-m"):
            return a == "-mtrainledger"
        if a in ("-X", "-W", "--check-hash-based-pycs"):  # an option whose value is the next argument
            i += 2
            continue
        if not a.startswith("-") or a == "-" or a.startswith("-c"):
            return False  # a script, standard input or -c: its arguments are not the interpreter's
        i += 1
    return False


if _is_command():  # the first thing the command runs: from here Ctrl-C is one line and exit 130, never a traceback
    import signal as _signal

    # unless SIGINT came ignored (``nohup``, or ``CMD &`` in a script: the terminal's Ctrl-C is not for this
    # command), which Python itself honours and the command keeps
    if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _interrupted_at_startup)

from trainledger import _moved  # noqa: E402

_moved.install()   # 0.1.0's module names (trainledger.training.checkpoint, ...) still import, with a warning

_JOURNAL_NAMES = ("Event", "IntegrityError", "Journal", "JournalError", "PublicKey", "Signer", "StepObserved",
                  "TrainledgerError", "TrustPolicy", "VerifyReport", "__version__", "keygen", "load_public_key", "load_signer",
                  "read_events", "read_signed_events", "trusted_keys", "verify")

# Every name resolves on first use (PEP 562): importing trainledger loads nothing (the CLI installs its Ctrl-C
# handling before the journal is loaded); the torch-side names import torch only then.
_LAZY = {
    "TrainingHealthMonitor": "trainledger.training.health.monitor",
    "build_causal_lm": "trainledger.training.reference.model",
    "flop_config_from_causal_lm": "trainledger.training.health.flops",
    "save_checkpoint": "trainledger.training.checkpoints.state",
    "restore_checkpoint": "trainledger.training.checkpoints.state",
    "Checkpointer": "trainledger.training.checkpoints.state",
    "Rung": "trainledger.ladder.rung",
    "run_pilot_ladder": "trainledger.ladder.runner",
    "open_query": "trainledger.journal.views.session",
    "verify_path": "trainledger.journal.views.verifying",
    # W&B's calls (``import trainledger as wandb``): trainledger.tracking
    "init": "trainledger.tracking", "log": "trainledger.tracking", "finish": "trainledger.tracking",
    "define_metric": "trainledger.tracking", "watch": "trainledger.tracking", "login": "trainledger.tracking",
    "save": "trainledger.tracking", "Settings": "trainledger.tracking",
    # TensorBoard's SummaryWriter (add_scalar, add_scalars, add_hparams)
    "SummaryWriter": "trainledger.tracking",
}
#: W&B's module attributes that follow the current run: ``run`` (None before ``init``), ``config``, ``summary``
_CURRENT = ("run", "config", "summary")


def __getattr__(name: str):
    import importlib

    if name in _JOURNAL_NAMES:
        value = getattr(importlib.import_module("trainledger.journal"), name)
        globals()[name] = value  # resolved once: the next use is a plain module attribute (wandb.log in a loop)
        return value
    if name in _CURRENT:
        tracking = importlib.import_module("trainledger.tracking")
        run = tracking.current
        if name == "run":
            return run
        if run is None:
            raise AttributeError(f"trainledger.{name} is the current run's: call trainledger.init() first")
        return getattr(run, name)
    if name not in _LAZY:
        raise AttributeError(f"module 'trainledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [*_JOURNAL_NAMES, *_LAZY]
