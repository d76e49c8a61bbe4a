"""hcfuse's fusion in an Olive workflow: the ``HcLowRankMixFusion`` surgeon of Olive's GraphSurgeries pass.

Olive (olive-ai, ``pip install "hcfuse[olive]"``) finds a surgeon by its class name in the registry that
``olive.passes.onnx.graph_surgeries.Surgeon`` fills as subclasses are defined, so importing this module is
what makes ``{"surgeon": "HcLowRankMixFusion"}`` known to every GraphSurgeries pass of the process::

    import olive.workflows
    import hcfuse.integrations.olive  # registers the surgeon

    olive.workflows.run("olive_config.json")

``python -m hcfuse.integrations.olive run --config olive_config.json`` is the ``olive`` command with the
surgeon registered (Olive's own command imports no user code for GraphSurgeries).

The surgeon runs the whole fusion pass (HcLowRankMixFusionPass: node-order sorting, the standard-ONNX
expansions' canonical form, the schemas and opset import, unused constants removed), not only the bare
rewrite rules, so it is a plain ``Surgeon`` rather than a rule-set surgeon. Blocks whose projections
Olive's int4 pass (OnnxBlockWiseRtnQuantization) turned into MatMulNBits fuse into
ai.hcfuse.HyperConnectionLowRankMixNBits (that pass writes scales and zero points flat, [N * k_blocks]; the
fusion takes them as [N, k_blocks] tensors of the same bytes). The fused model runs in onnxruntime with hcfuse's library
registered (``hcfuse.register(session_options)``); the surgeon itself needs no onnxruntime.
"""

from __future__ import annotations

import logging
import sys

import onnx_ir as ir

from hcfuse.rewrite import HcLowRankMixFusionPass

try:
    from olive.passes.onnx.graph_surgeries import Surgeon
except ModuleNotFoundError as error:  # Olive itself missing; its own broken imports propagate as they are
    if (error.name or "").partition(".")[0] != "olive":
        raise
    raise ImportError('hcfuse.integrations.olive needs Olive (olive-ai): pip install "hcfuse[olive]"') from error

logger = logging.getLogger(__name__)

__all__ = ["HcLowRankMixFusion", "main"]


class HcLowRankMixFusion(Surgeon):
    """Fuses every hyper-connection block (dense or MatMulNBits projections) into hcfuse's fused op.

    Config: ``{"surgeon": "HcLowRankMixFusion"}``; ``"debug": true`` prints the fusion report to stderr.
    A model with no block that fuses passes through unchanged, with a warning naming why each candidate
    was left.
    """

    def __init__(self, debug: bool = False):
        super().__init__()
        self.debug = debug

    def call_ir(self, model: ir.Model) -> ir.Model:
        report = HcLowRankMixFusionPass(debug=self.debug)(model).report
        if report.fused:
            logger.info("hcfuse: fused %d hyper-connection block(s)", len(report.fused))
        else:
            reasons = "; ".join(f"{item.anchor}: {item.reason}" for item in report.rejected) or "no candidate found"
            logger.warning("hcfuse: no hyper-connection block fused (%s)", reasons)
        return model


def main(argv: list[str] | None = None) -> int | None:
    """Olive's command line (``olive run --config ...`` and the rest) with the surgeon registered."""
    from olive.cli.launcher import main as olive_main

    return olive_main(argv, called_as_console_script=False)


if __name__ == "__main__":
    sys.exit(main())
