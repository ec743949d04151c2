"""The verified events of journals and run folders as a Parquet dataset with receipts (``trainledger export
parquet``), and its re-verification (``trainledger verify OUT``): :mod:`.export`, :mod:`.check`."""

from trainledger.journal.views.parquet.export import EXPORT_FORMAT, LISTING, ExportReport, export_parquet, is_export

__all__ = ["EXPORT_FORMAT", "LISTING", "ExportReport", "export_parquet", "is_export"]
