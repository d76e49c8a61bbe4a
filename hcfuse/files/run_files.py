"""The files a run reads and writes, and the rule between them: no output is an input.

Outputs are the model, its external data file (``<output>.data``, whether or not this run writes
external data: it may replace or remove it) and the report; inputs are the model and every
external data file it reads. Paths are compared after resolving links and relative parts, and as
files (hard links), so no spelling of a path gets around the rule.
"""

from __future__ import annotations

import dataclasses
import os

import onnx_ir as ir

from hcfuse.files import model_io


@dataclasses.dataclass(frozen=True)
class RunFiles:
    input: str
    input_data: tuple[str, ...]  # absolute paths of the input's external data files
    output: str
    output_data: str  # absolute path of <output>.data
    report: str | None = None

    @classmethod
    def of(cls, input: str | os.PathLike, model: ir.Model, output: str | os.PathLike,
           report: str | os.PathLike | None = None) -> RunFiles:
        output = os.fspath(output)
        data = os.path.join(os.path.dirname(os.path.abspath(output)), model_io.data_file_name(output))
        return cls(os.fspath(input), tuple(sorted(model_io.external_data_paths(model))), output, data,
                   os.fspath(report) if report is not None else None)

    @property
    def inputs(self) -> list[str]:
        return [self.input, *self.input_data]

    def check(self) -> None:
        """Raises ModelIOError, one line naming both files, when an output would replace an input (or
        the report an output), or an output path cannot be written."""
        model_io.check_writable(self.output, "output")
        if os.path.isdir(self.output_data):
            raise model_io.ModelIOError(f"{self.output}: its external data path {self.output_data} is a directory")
        if self.report is not None:
            model_io.check_writable(self.report, "report")
        outputs = [("output", self.output), ("output data", self.output_data)]
        if self.report is not None:
            outputs.append(("report", self.report))
        inputs = [("input", self.input), *(("input data", d) for d in self.input_data)]
        for out_role, path in outputs:
            for in_role, used in inputs:
                if model_io.same_file(path, used):
                    raise model_io.ModelIOError(_MESSAGES[out_role, in_role].format(out=self.output, data=path,
                                                                                    report=path, used=used))
        if self.report is not None:
            for other, what in [(self.output, "the output model"), (self.output_data, "the output's data file")]:
                if model_io.same_file(self.report, other):
                    raise model_io.ModelIOError(f"{self.report}: the report would overwrite {what} {other}; "
                                                "write it to a new path")


_NEW_PATH = "; write to a new path"
_MESSAGES = {
    ("output", "input"): "{out}: output is the input file {used}" + _NEW_PATH,
    ("output", "input data"): "{out}: output is the input model's external data file {used}" + _NEW_PATH,
    ("output data", "input"): "{out}: its external data file {data} is the input model {used}" + _NEW_PATH,
    ("output data", "input data"): "{out}: its external data file {data} is read by the input model "
                                   "(external data file {used})" + _NEW_PATH,
    ("report", "input"): "{report}: the report would overwrite the input model {used}" + _NEW_PATH,
    ("report", "input data"): "{report}: the report would overwrite the input model's external data file "
                              "{used}" + _NEW_PATH,
}
