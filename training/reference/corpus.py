"""Training data made by our own code: a seeded Markov source with a known entropy rate.

A first-order Markov chain over ``vocab`` tokens with Dirichlet-drawn
transition rows. Its entropy rate, ``H = sum_i pi_i * H(P[i, :])`` nats per
token under the stationary distribution ``pi``, is the lowest mean
cross-entropy any model can reach on it, so "loss within 0.1 nats of the
entropy rate" is a target that means something. ``text_tokens`` reads a real
text file as bytes (vocab 256) instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["MarkovSource", "text_tokens", "random_batches", "BatchSampler"]


class MarkovSource:
    """A seeded first-order Markov source.

    ``concentration`` is the Dirichlet parameter of each transition row: small
    values give peaked rows (low entropy, easy to learn), large ones rows close
    to uniform (entropy near ``log(vocab)``).
    """

    def __init__(self, vocab: int, *, seed: int = 0, concentration: float = 0.3):
        if not isinstance(vocab, int) or vocab < 2:
            raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
        if not concentration > 0:
            raise ValueError(f"concentration must be positive, got {concentration!r}")
        self.vocab = vocab
        self.seed = seed
        alpha = torch.full((vocab,), float(concentration), dtype=torch.float64)
        # torch's Dirichlet samples from the global generator: seed it inside a fork,
        # so building a source neither depends on nor disturbs the caller's RNG state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.transition = torch.distributions.Dirichlet(alpha).sample((vocab,))
        self.stationary = _stationary(self.transition)

    @property
    def entropy_rate(self) -> float:
        """Nats per token: the floor of the mean next-token cross-entropy."""
        p = self.transition
        row_h = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(dim=1)
        return float((self.stationary * row_h).sum())

    def sample(self, n_tokens: int, *, seed: int) -> torch.Tensor:
        """``n_tokens`` tokens (int64) from the stationary start, reproducible by ``seed``."""
        g = torch.Generator().manual_seed(seed)
        out = torch.empty(n_tokens, dtype=torch.long)
        state = int(torch.multinomial(self.stationary.float(), 1, generator=g))
        cdf = self.transition.cumsum(dim=1)
        u = torch.rand(n_tokens, generator=g, dtype=torch.float64)
        for i in range(n_tokens):
            out[i] = state
            state = min(int(torch.searchsorted(cdf[state], u[i])), self.vocab - 1)
        return out


def _stationary(p: torch.Tensor) -> torch.Tensor:
    pi = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
    for _ in range(10_000):
        nxt = pi @ p
        if torch.max(torch.abs(nxt - pi)) < 1e-14:
            return nxt
        pi = nxt
    return pi


def text_tokens(path: str | Path) -> torch.Tensor:
    """A real text file as byte tokens (vocab 256)."""
    data = Path(path).read_bytes()
    if len(data) < 2:
        raise ValueError(f"{path}: need at least 2 bytes of text")
    return torch.tensor(list(data), dtype=torch.long)


def random_batches(tokens: torch.Tensor, batch: int, block: int, *, seed: int):
    """Endless ``(x, y)`` batches of ``block``-long windows, y shifted by one; reproducible by ``seed``."""
    if tokens.numel() <= block + 1:
        raise ValueError(f"need more than block + 1 = {block + 1} tokens, have {tokens.numel()}")
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, tokens.numel() - block - 1, (batch,), generator=g)
        x = torch.stack([tokens[s:s + block] for s in starts.tolist()])
        y = torch.stack([tokens[s + 1:s + 1 + block] for s in starts.tolist()])
        yield x, y


class BatchSampler:
    """Random ``(x, y)`` windows with a cursor that checkpoints: ``state_dict()`` / ``load_state_dict()``.

    Restoring the state makes the sampler yield exactly the batches it would have
    yielded next; skipping ``n`` batches (a spike rewind's data window) is ``skip(n)``.
    """

    def __init__(self, tokens: torch.Tensor, batch: int, block: int, *, seed: int):
        if tokens.numel() <= block + 1:
            raise ValueError(f"need more than block + 1 = {block + 1} tokens, have {tokens.numel()}")
        self.tokens, self.batch, self.block, self.seed = tokens, batch, block, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.tokens.numel() - self.block - 1, (self.batch,), generator=self.generator)
        self.batches_drawn += 1
        s = starts.tolist()
        x = torch.stack([self.tokens[i:i + self.block] for i in s])
        y = torch.stack([self.tokens[i + 1:i + 1 + self.block] for i in s])
        return x, y

    def skip(self, n: int) -> None:
        for _ in range(n):
            torch.randint(0, self.tokens.numel() - self.block - 1, (self.batch,), generator=self.generator)
            self.batches_drawn += 1

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches_drawn": self.batches_drawn, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed:
            raise ValueError(f"sampler state is for seed {state.get('seed')}, this sampler uses seed {self.seed}")
        self.generator.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])
