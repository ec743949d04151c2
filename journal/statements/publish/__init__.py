"""Publishing a team's runs outside the trainer (docs/publishing.md): the organisation log (:mod:`.orglog`)."""
