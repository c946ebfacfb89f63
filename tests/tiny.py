"""Tiny random-weight Llama models for engine tests (sharp logits, so greedy has no near-ties)."""

from __future__ import annotations

import torch

from serving.llama import CausalLM, ModelConfig

TINY = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                   num_kv_heads=2, head_dim=8, max_position=256)


def tiny_model(seed: int, cfg: ModelConfig = TINY, scale: float = 4.0) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        for layer in model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.norm.weight.fill_(1.0)
        model.lm_head.weight.mul_(scale)
    return model.eval()
