"""Builders of the ONNX models the demo, the tests and the benchmarks run (shipped with the package).

- `hcfuse.models.hc_block`: one fused HyperConnectionLowRankMix node, random weights and activations;
- `hcfuse.models.qwen_decode`: decode graphs holding the stock, unfused chain as the exporter writes it;
- `hcfuse.models.genai_expansion`, `genai_model_folder`: onnxruntime-genai's standard-ONNX form and model folders;
- `hcfuse.models.mobius_block`: the block as onnxruntime's mobius exporter writes it;
- `hcfuse.models.nbits`, `quantized`: MatMulNBits weights and quantized models (onnxruntime's quantizer);
- `python -m hcfuse.models.build OUT.onnx`: the decode builder as a command.
"""
