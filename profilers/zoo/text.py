"""Transformer models of the zoo, in plain torch: the encoder-decoder Transformer
(base), BERT (base, large; masked-LM head) and GPT-2 (small to XL).

Shapes follow the published models, so parameter counts match them: BERT-base
with its MLM head has 109,514,298 parameters, GPT-2 small 124,439,808 (output
projection tied to the token embedding, as published). Attention uses
``F.scaled_dot_product_attention`` (one op per attention, counted by the flop
counter) and reshapes by ``unflatten``/``flatten`` so that torch.fx traces every
model without shape-dependent Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (Transformer, BERT)."""

    def __init__(self, d_model: int, heads: int, dropout: float, causal: bool = False):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        kv = x if memory is None else memory
        q, k, v = self._split(self.q(x)), self._split(self.k(kv)), self._split(self.v(kv))
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        return self.out(o.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation=F.relu):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.activation(self.fc1(x))))


# ---------------------------------------------------------------------------- Transformer
@dataclass(frozen=True)
class TransformerConfig:
    vocab: int = 37000
    d_model: int = 512
    heads: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    max_len: int = 1024


class EncoderLayer(nn.Module):
    """Post-norm encoder layer of Vaswani et al. (2017)."""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = SelfAttention(c.d_model, c.heads, c.dropout)
        self.norm1 = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.self_attn(x)))
        return self.norm2(x + self.drop(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = SelfAttention(c.d_model, c.heads, c.dropout, causal=True)
        self.norm1 = nn.LayerNorm(c.d_model)
        self.cross_attn = SelfAttention(c.d_model, c.heads, c.dropout)
        self.norm2 = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout)
        self.norm3 = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.self_attn(x)))
        x = self.norm2(x + self.drop(self.cross_attn(x, memory)))
        return self.norm3(x + self.drop(self.ffn(x)))


def sinusoidal_positions(max_len: int, d_model: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div[: d_model // 2])
    return table


class Transformer(nn.Module):
    """Encoder-decoder Transformer (base): shared source/target embedding tied to the output."""

    def __init__(self, c: TransformerConfig = TransformerConfig()):
        super().__init__()
        self.scale = math.sqrt(c.d_model)
        self.embed = nn.Embedding(c.vocab, c.d_model)
        nn.init.normal_(self.embed.weight, 0.0, c.d_model ** -0.5)
        self.register_buffer("positions", sinusoidal_positions(c.max_len, c.d_model), persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = self.positions[: tokens.size(1)]
        return self.drop(self.embed(tokens) * self.scale + pos)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory = self._embed(src)
        for layer in self.encoder:
            memory = layer(memory)
        x = self._embed(tgt)
        for layer in self.decoder:
            x = layer(x, memory)
        return F.linear(x, self.embed.weight)


# ---------------------------------------------------------------------------- BERT
@dataclass(frozen=True)
class BertConfig:
    vocab: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    max_positions: int = 512
    type_vocab: int = 2
    dropout: float = 0.1


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab, c.hidden)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden)
        self.token_type_embeddings = nn.Embedding(c.type_vocab, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=1e-12)
        self.dropout = nn.Dropout(c.dropout)
        self.register_buffer("position_ids", torch.arange(c.max_positions).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.size(1)]
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(torch.zeros_like(input_ids)))
        return self.dropout(self.LayerNorm(x))


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = SelfAttention(c.hidden, c.heads, c.dropout)
        self.attention_norm = nn.LayerNorm(c.hidden, eps=1e-12)
        self.ffn = FeedForward(c.hidden, c.intermediate, c.dropout, activation=F.gelu)
        self.output_norm = nn.LayerNorm(c.hidden, eps=1e-12)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.drop(self.attention(x)))
        return self.output_norm(x + self.drop(self.ffn(x)))


class Bert(nn.Module):
    """BERT (Devlin et al. 2019) encoder with the masked-LM head (decoder tied to embeddings)."""

    def __init__(self, c: BertConfig = BertConfig()):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = nn.ModuleList(BertLayer(c) for _ in range(c.layers))
        self.mlm = nn.Linear(c.hidden, c.hidden)
        self.mlm_norm = nn.LayerNorm(c.hidden, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(c.vocab))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        for layer in self.encoder:
            x = layer(x)
        x = self.mlm_norm(F.gelu(self.mlm(x)))
        return F.linear(x, self.embeddings.word_embeddings.weight, self.mlm_bias)


# ---------------------------------------------------------------------------- GPT-2
@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 50257
    d_model: int = 768
    layers: int = 12
    heads: int = 12
    max_positions: int = 1024
    dropout: float = 0.1


class GPT2Attention(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.heads = c.heads
        self.dropout = c.dropout
        self.c_attn = nn.Linear(c.d_model, 3 * c.d_model)
        self.c_proj = nn.Linear(c.d_model, c.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.c_attn(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.c_proj(o.transpose(1, 2).flatten(2))


class GPT2Block(nn.Module):
    """Pre-norm GPT-2 block: attention and a 4x GELU MLP, each with a residual."""

    def __init__(self, c: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.d_model)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.d_model)
        self.mlp = FeedForward(c.d_model, 4 * c.d_model, c.dropout,
                               activation=lambda t: F.gelu(t, approximate="tanh"))
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 (Radford et al. 2019) language model; ``lm_head`` is tied to ``wte``."""

    def __init__(self, c: GPT2Config = GPT2Config()):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.max_positions, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.register_buffer("position_ids", torch.arange(c.max_positions).unsqueeze(0),
                             persistent=False)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith("fc2.weight") or \
                    name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.size(1)]
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)
