"""Reading an onnxruntime-genai folder's genai_config.json: the decoder it names and its session options.

Every problem is one line naming the file and what is wrong (GenaiConfigError, a ValueError).
"""

from __future__ import annotations

import json
import os

from hcfuse.files.model_io import ModelIOError

CONFIG_NAME = "genai_config.json"


class GenaiConfigError(ModelIOError, ValueError):
    """genai_config.json is missing, not JSON, or not shaped as onnxruntime-genai reads it."""


class GenaiConfig:
    """MODEL_DIR/genai_config.json, parsed and checked; ``data`` is edited in place and written back."""

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, CONFIG_NAME)
        if not os.path.isfile(self.path):
            raise GenaiConfigError(f"{model_dir}: no {CONFIG_NAME} (not an onnxruntime-genai model folder)")
        try:
            with open(self.path, encoding="utf-8") as f:
                self.data = json.load(f)
        except RecursionError as e:
            raise GenaiConfigError(f"{self.path}: not valid JSON (nested too deeply)") from e
        except (ValueError, UnicodeDecodeError) as e:
            raise GenaiConfigError(f"{self.path}: not valid JSON ({' '.join(str(e).split())})") from e
        model = self._object(self.data, "the file")
        model = self._object(model.get("model"), "model")
        decoder = self._object(model.get("decoder"), "model.decoder")
        if "pipeline" in decoder:
            raise GenaiConfigError(f"{self.path}: model.decoder.pipeline (a multi-model decoder) is not "
                                   "supported; fuse its model files one by one with `hcfuse optimize`")
        filename = decoder.get("filename")
        if not isinstance(filename, str) or not filename or os.path.basename(filename) != filename \
                or filename in (".", ".."):
            raise GenaiConfigError(f"{self.path}: model.decoder.filename must name a file in the folder; "
                                   f"got {filename!r}")
        if filename == CONFIG_NAME:
            raise GenaiConfigError(f"{self.path}: model.decoder.filename names {CONFIG_NAME} itself")
        self.decoder_name = filename
        if not isinstance(decoder.setdefault("session_options", {}), dict):
            raise GenaiConfigError(f"{self.path}: model.decoder.session_options must be an object; "
                                   f"got {type(decoder['session_options']).__name__}")
        self.options = decoder["session_options"]

    def _object(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            found = "nothing" if value is None else f"a JSON {_JSON_KIND.get(type(value), type(value).__name__)}"
            raise GenaiConfigError(f"{self.path}: {where} must be a JSON object; got {found}")
        return value

    def write(self, path: str) -> None:
        """The config, indented as the model builder writes it, with the input file's permissions."""
        with open(path, "x", encoding="utf-8") as f:
            json.dump(self.data, f, indent=4)
            f.write("\n")
        os.chmod(path, os.stat(self.path).st_mode & 0o7777)


_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
