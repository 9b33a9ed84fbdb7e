"""The job wrapper (orchestrator/job/megatron_run.main) running an entry script beside Megatron-LM dev's own
`megatron/`, as a rank probe's job does: the probe mode it installs from the job's environment, in that
interpreter, before the script runs.

`python -m tests.job.probe_mode_run <megatron tree> <folder>` (tests/megatron_env.run_in_tree): `folder` gets a
`megatron` link to the tree's and an entry script that reports what it finds; the wrapper runs it with a probe's
`--fake-process-group` flag, first with ORCH_PROBE_MODE set, then with a mode this job does not know. Prints one
JSON line: each run's exit code, the entry's report, the wrapper's first stdout line and the sidecar's probe_mode.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

ENTRY = """
import json, sys
from megatron.core.pipeline_parallel import p2p_communication as p2p
from megatron.core.transformer.moe import token_dispatcher as td
from orchestrator.job import probe_mode
done = probe_mode.installed()
print("ENTRY " + json.dumps({
    "installed": done.report() if done else None,
    "shapes_patched": p2p.P2PCommunicator._communicate_shapes.__module__ == "orchestrator.job.probe_mode",
    "a2a_patched": td.all_to_all.__module__ == "orchestrator.job.probe_mode",
    "megatron": p2p.__file__,
    "argv": sys.argv[1:],
}))
"""


def main(tree: Path, folder: Path) -> dict:
    from orchestrator.job import megatron_check, megatron_run
    from orchestrator.plan import probe

    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "megatron"
    if not link.exists():
        link.symlink_to(tree / "megatron", target_is_directory=True)
    script = folder / "pretrain_probe_check.py"
    script.write_text(ENTRY)
    sys.path.insert(0, str(folder))
    megatron_check.import_megatron()  # CPU shims (triton stand-in, typing.override); a GPU node needs none
    out = {}
    for name, mode in (("mode", probe.MODE), ("unknown", "static-balanced/0")):
        os.environ[probe.MODE_ENV] = mode
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            code = megatron_run.main(
                str(script), ["--pipeline-model-parallel-size", "4", probe.FAKE_FLAG], (0, 1), folder / name, 3
            )
        lines = buf.getvalue().splitlines()
        entry = next((json.loads(ln[6:]) for ln in lines if ln.startswith("ENTRY ")), None)
        sidecar = json.loads((folder / name / "sidecar-rank-3.json").read_text())
        out[name] = {
            "code": code,
            "entry": entry,
            "first": lines[0] if lines else "",
            "stderr": err.getvalue()[-400:],
            "sidecar": sidecar.get("probe_mode"),
            "versions": sidecar.get("versions", {}).get("probe_mode"),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
