"""A tiny Llama (hidden 128, head size 64) for fast plumbing tests on real vLLM.

Its weights make every step emit the same ordinary token, never EOS, so a
request always runs to ``max_tokens`` and timings are predictable: embeddings
are zero, so the residual stream is the last MLP's ``down_proj`` bias, and the
LM head scores one token far above the rest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def build_tiny_llama(target: Path, tokenizer_dir: Path, *, token: str = " hello") -> Path:
    """Write the model and the SmolLM2 tokenizer files into ``target``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    token_id = tokenizer.encode(token, add_special_tokens=False)[0]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        mlp_bias=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        for layer in model.model.layers:
            layer.mlp.gate_proj.bias.zero_()
            layer.mlp.up_proj.bias.zero_()
            layer.mlp.down_proj.bias.zero_()
        direction = torch.randn(config.hidden_size)
        model.model.layers[-1].mlp.down_proj.bias.copy_(direction)
        normed = direction / direction.pow(2).mean().sqrt()
        model.lm_head.weight.zero_()
        model.lm_head.weight[token_id] = normed
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    for name in ("chat_template.jinja",):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, target / name)
    config_path = target / "config.json"
    data = json.loads(config_path.read_text())
    data["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(data, indent=2))
    return target
