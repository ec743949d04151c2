"""A tiny causal LM in the nanoGPT mould, for tests, demos and the pilot ladder.

GPT-2 style: learned token and position embeddings, pre-norm blocks of
causal self-attention and a 4x GELU MLP, a final LayerNorm and an output head
tied to the token embedding. Attention is computed unfused by default (two
matmuls and a masked softmax), so that ``torch.utils.flop_counter`` sees every
FLOP; ``attn_impl="sdpa"`` uses PyTorch's fused kernel instead.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CausalLM", "build_causal_lm"]

_ATTN_IMPLS = ("unfused", "sdpa")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, block: int, dropout: float, attn_impl: str):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.attn_impl = attn_impl
        self.dropout = dropout
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)).view(1, 1, block, block),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        if self.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, block: int, dropout: float, attn_impl: str):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block, dropout, attn_impl)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CausalLM(nn.Module):
    """``model(idx)`` maps token ids ``(B, T)`` to next-token logits ``(B, T, vocab)``."""

    def __init__(self, vocab: int, d_model: int, n_layer: int, n_head: int, block: int,
                 dropout: float = 0.0, attn_impl: str = "unfused"):
        super().__init__()
        for name, v in (("vocab", vocab), ("d_model", d_model), ("n_layer", n_layer), ("n_head", n_head),
                        ("block", block)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if attn_impl not in _ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {_ATTN_IMPLS}, got {attn_impl!r}")
        self.vocab, self.d_model, self.n_layer, self.n_head, self.block = vocab, d_model, n_layer, n_head, block
        self.attn_impl = attn_impl
        #: full activation checkpointing: each block's forward is recomputed in the backward pass (off by default;
        #: ``gradient_checkpointing_enable()``, the name Hugging Face models use)
        self.activation_checkpointing = False
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(block, d_model)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(d_model, n_head, block, dropout, attn_impl) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied output head (nanoGPT, GPT-2)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by 1/sqrt(2L)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; ``non_embedding`` leaves out the position embedding (nanoGPT's convention).

        The token embedding stays in: it is the (tied) output head's weight.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wpe.weight.numel()
        return n

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each block's forward in the backward pass (full activation checkpointing)."""
        self.activation_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        if t > self.block:
            raise ValueError(f"sequence length {t} exceeds the model's block size {self.block}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for blk in self.h:
            if recompute:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.lm_head(self.ln_f(x))


def build_causal_lm(vocab: int, d_model: int, n_layer: int, n_head: int, block: int, *,
                    dropout: float = 0.0, attn_impl: str = "unfused") -> CausalLM:
    """Build the tiny GPT. Example: ``build_causal_lm(vocab=32, d_model=16, n_layer=2, n_head=2, block=8)``.

    Raises ``ValueError`` for a shape that cannot be built.
    """
    return CausalLM(vocab, d_model, n_layer, n_head, block, dropout=dropout, attn_impl=attn_impl)
