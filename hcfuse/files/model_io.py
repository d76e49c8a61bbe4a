"""Loading and saving models: the names the other layers use, from the modules that do the work.

hcfuse.files.model_loading (load, checked, weights left on disk), hcfuse.files.model_checks (what
onnxruntime would refuse), hcfuse.files.model_saving (one commit point for model and data),
hcfuse.files.stale_runs (killed runs' leftovers), hcfuse.files.paths (path rules) and
hcfuse.files.errors (ModelIOError).
"""

from __future__ import annotations

from hcfuse.files.errors import ModelIOError
from hcfuse.files.model_loading import (EXTERNAL_THRESHOLD_BYTES, INLINE_LIMIT_BYTES, external_data_paths,
                                        initializer_bytes, load, locations, needs_external_data,
                                        read_by_real_paths, skeleton_proto)
from hcfuse.files.model_saving import StagedModel, directory_lock, save, staged
from hcfuse.files.paths import check_writable, data_file_name, same_file
from hcfuse.files.stale_runs import remove_stale_temporaries

__all__ = ["EXTERNAL_THRESHOLD_BYTES", "INLINE_LIMIT_BYTES", "ModelIOError", "StagedModel", "check_writable",
           "data_file_name", "directory_lock", "external_data_paths", "initializer_bytes", "load", "locations",
           "needs_external_data", "read_by_real_paths", "remove_stale_temporaries", "same_file", "save",
           "skeleton_proto", "staged"]
