"""Where the journal meets other systems, each an optional extra: distributed engines that run the verifier as
their tasks (:mod:`.ray`: the engine schedules and carries results back, never verifies; the driver checks the
cross-rank anchors with the same code ``verify RUN_DIR`` runs), object storage (:mod:`.storage`), and signers
whose keys never sit in a file (:mod:`.kms`, :mod:`.hsm`: PKCS#11). The core names the signers only by URI
scheme (``journal/keys.py``: ``SIGNER_BACKENDS``); nothing below this folder imports it.
"""
