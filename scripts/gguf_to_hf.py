"""Writes a GGUF checkpoint out as a Hugging Face model directory, with transformers' own GGUF
loader and writer: `config.json`, `generation_config.json`, bf16 `model.safetensors`,
`tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja`, as a user who downloads a
model gets them. Used by `scripts/real-model.sh`:

    python scripts/gguf_to_hf.py FILE.gguf OUT_DIR
"""

import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig


def main():
    gguf_path, out = sys.argv[1], sys.argv[2]
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # transformers 5 keeps GGUF weights in their blocks unless told to unpack them, and such a
    # model cannot be saved: dequantize, then store bf16 as most checkpoints on the Hub are.
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main()
