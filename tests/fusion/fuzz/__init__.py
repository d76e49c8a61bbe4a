"""Differential fuzz of the fusion pass: seeded mutants of valid stock chains (bases), run before and
after hcfuse.optimize_with_report in onnxruntime CPU on the same feeds (run)."""
