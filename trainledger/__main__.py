"""``python -m trainledger``: the ``trainledger`` command."""

from trainledger.cli import entry

entry()
