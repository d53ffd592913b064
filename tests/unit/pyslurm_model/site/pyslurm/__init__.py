"""The recorded model as an importable ``pyslurm``, for the backend's worker process.

``PyslurmScheduler`` runs pyslurm in a child process (``python -c ... _serve()``), which
imports ``pyslurm`` afresh: with this directory's parent on its PYTHONPATH it gets the model
(``../../fake_pyslurm.py``) over the World described by the JSON file ``$FAKE_PYSLURM_WORLD``
(World's fields; job ids as strings; ``fail`` maps a method to ``["RPCError", errno]`` or
``["RuntimeError", text]``). It appends each call it receives, one JSON list per
line, to ``$FAKE_PYSLURM_CALLS`` when set. ``$FAKE_PYSLURM_EXIT`` set: it ends the process at
import, as real pyslurm's ``slurm_init()`` does on a fatal slurm.conf error.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

if os.environ.get("FAKE_PYSLURM_EXIT"):
    print("python: fatal: Could not establish a configuration source", file=sys.stderr)
    os._exit(1)

_path = Path(__file__).resolve().parents[2] / "fake_pyslurm.py"
_spec = importlib.util.spec_from_file_location("fake_pyslurm_in_worker", _path)
_model = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _model  # dataclasses look their module up while building
_spec.loader.exec_module(_model)


class _Calls(list):
    def append(self, call):
        super().append(call)
        if os.environ.get("FAKE_PYSLURM_CALLS"):
            with open(os.environ["FAKE_PYSLURM_CALLS"], "a") as fh:
                fh.write(json.dumps(call) + "\n")


_values = json.loads(Path(os.environ["FAKE_PYSLURM_WORLD"]).read_text())
_values["jobs"] = {int(k): v for k, v in _values.get("jobs", {}).items()}
_fail = _values.pop("fail", {})
_world = _model.World(**_values)
_world.calls = _Calls()
_module = _model.build(_world)
for _method, (_kind, _arg) in _fail.items():
    _world.fail[_method] = _module.RPCError(_arg) if _kind == "RPCError" else RuntimeError(_arg)
# `import pyslurm` returns what sys.modules holds once this module has run
sys.modules[__name__] = _module
