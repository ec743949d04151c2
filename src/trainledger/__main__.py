"""``python -m trainledger``: the ``trainledger`` command (Ctrl-C during start-up is handled in ``trainledger.cli``)."""

from trainledger.cli import entry

entry()
