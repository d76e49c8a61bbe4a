"""Builders of the ONNX models the demo, the tests and the benchmarks run (shipped with the package).

- `hcfuse.models.hc_block`: one fused HyperConnectionLowRankMix node, random weights and activations;
- `hcfuse.models.qwen_decode`: decode graphs holding the stock, unfused chain as the exporter writes it;
- `python -m hcfuse.models.build OUT.onnx`: the decode builder as a command.
"""
