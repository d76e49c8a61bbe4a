"""A model folder shaped like onnxruntime-genai's model builder output, around a decode graph.

The builder (microsoft/onnxruntime-genai, `src/python/py/models/builders/base.py`: save_model,
make_genai_config, save_processing) writes `model.onnx` with every weight in `model.onnx.data`,
`genai_config.json` (model.decoder.session_options {log_id, provider_options}, filename, head_size,
hidden_size, inputs, outputs, head and layer counts; model ids and type; search) and the tokenizer's
files. Here the decoder is hcfuse.models.qwen_decode's graph; the tokenizer files are small stand-ins
(nothing in hcfuse reads them: they only have to travel with the folder).
"""

from __future__ import annotations

import json
import os

from hcfuse.models.qwen_decode import build_decode_model, save_decode_model

MODEL_FILE = "model.onnx"
TOKENIZER_FILES = {
    "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}},
    "tokenizer_config.json": {"model_max_length": 2048, "tokenizer_class": "Qwen2Tokenizer"},
    "special_tokens_map.json": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
}


def genai_config(num_blocks: int, input_names: list[str], *, hidden: int, vocab_size: int = 151936,
                 context_length: int = 2048) -> dict:
    """genai_config.json as the builder writes it for a CPU decoder (empty provider_options)."""
    inputs = dict(zip(input_names, input_names))
    inputs.update({"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"})
    return {
        "model": {
            "bos_token_id": 151643,
            "context_length": context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": MODEL_FILE,
                "head_size": 128,
                "hidden_size": hidden,
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": 16,
                "num_hidden_layers": num_blocks // 2 or 1,
                "num_key_value_heads": 8,
            },
            "eos_token_id": [151645, 151643],
            "pad_token_id": 151643,
            "type": "qwen3",
            "vocab_size": vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }


def save_genai_model_folder(directory: str | os.PathLike, num_blocks: int, **options) -> str:
    """Writes the folder (created if missing): model.onnx + model.onnx.data (save_decode_model with
    options), genai_config.json and the tokenizer files. Returns the directory."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    save_decode_model(os.path.join(directory, MODEL_FILE), num_blocks, external_data=True, **options)
    model = build_decode_model(num_blocks, **options)  # lazy weights: only the graph's names are read
    hidden = model.graph.inputs[0].shape[-1]
    config = genai_config(num_blocks, [v.name for v in model.graph.inputs], hidden=hidden)
    files = {"genai_config.json": config, **TOKENIZER_FILES}
    for name, content in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=4)
    return directory
