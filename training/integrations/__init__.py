"""trainledger inside the frameworks users already train with: the Hugging Face ``Trainer`` callback
(:mod:`.hf`), the Lightning callback (:mod:`.lightning`), and what they share (:mod:`._common`)."""
