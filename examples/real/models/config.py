"""Model widths. Small by default (tests); every split dim divides by 8."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    batch: int = 8
    seq: int = 16
    d_model: int = 32
    n_heads: int = 8
    n_kv_heads: int = 8  # fewer than n_heads: grouped-query attention
    head_dim: int = 4
    d_ff: int = 64
    vocab: int = 64
    n_layers: int = 2
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # RMSNorm over the whole q / k projection (OLMo-2 style)
    head_norm: bool = False  # RMSNorm per head with one head_dim weight for all heads (Qwen3)
    rope_theta: float = 10000.0
    n_experts: int = 8
    top_k: int = 2

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim


GPT2 = Config()
LLAMA3 = Config(n_heads=16, n_kv_heads=8)
QWEN2 = Config(n_heads=16, n_kv_heads=8, qkv_bias=True)
LLAMA3_QK_NORM = Config(n_heads=16, n_kv_heads=8, qk_norm=True)
QWEN3_HEAD_NORM = Config(n_heads=16, n_kv_heads=8, head_norm=True)
MOE = Config(n_heads=16, n_kv_heads=8, d_ff=32)
