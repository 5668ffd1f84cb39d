"""The export pipeline's workflow (.github/workflows/export-model.yml) runs the project's own
commands: each personaplex-edge command line in it, its variables filled in from the inputs,
parses with the CLI as it is now, and the inputs it reads are the ones it declares."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from personaplex_edge.cli import build_parser

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "export-model.yml"


def test_the_export_workflow_runs_commands_the_cli_accepts():
    wf = yaml.safe_load(WORKFLOW.read_text())
    inputs = (wf.get("on") or wf[True])["workflow_dispatch"]["inputs"]  # YAML 1.1: on = True
    assert {"checkpoint", "precision", "target_repo"} <= set(inputs)
    job = wf["jobs"]["export"]
    env = {k: v for k, v in job["env"].items()}
    used = {m for v in env.values() for m in re.findall(r"inputs\.(\w+)", str(v))}
    assert used <= set(inputs), used - set(inputs)
    sample = {"CHECKPOINT": "nvidia/personaplex-7b-v1", "PRECISION": "int4",
              "DEPFORMER_PRECISION": "int8", "BACKEND": "tensorrt",
              "TARGET_REPO": "someone/personaplex-int4", "PRIVATE": "true", "RTX_ENGINES": "true"}
    assert set(sample) <= set(env)
    script = "".join(step.get("run", "") for step in job["steps"])
    assert "flags+=(--library rtx)" in script and "flags+=(--no-engines)" in script
    for flags, engines in (("--depformer-precision int8 --no-engines --private", None),
                           ("--depformer-precision int8 --library rtx --private", "rtx")):
        export = _commands(job, sample, flags)
        assert export.library == ("rtx" if engines else "auto")
        assert export.no_engines == (engines is None)


def _commands(job, sample, flags):
    """The workflow's two commands parsed with `flags` for its "${flags[@]}"; the export's."""
    commands = []
    for step in job["steps"]:
        script = step.get("run", "").replace("\\\n", " ")
        for line in script.splitlines():
            if "personaplex-edge " not in line:
                continue
            line = line.replace('"${flags[@]}"', flags)
            line = re.sub(r'"\$(\w+)"', lambda m: shlex.quote(sample[m[1]]), line)
            words = shlex.split(line)
            commands.append(words[words.index(".venv/bin/personaplex-edge") + 1:])
    parsed = [build_parser().parse_args(args) for args in commands]  # SystemExit if not
    assert [a.command for a in parsed] == ["export", "verify"]
    export, verify = parsed
    assert export.push_to_hub == verify.model == "someone/personaplex-int4"
    assert (export.precision, export.depformer_precision, export.backend) == (
        "int4", "int8", "tensorrt")
    assert export.private
    assert verify.checkpoint == export.checkpoint and verify.json
    return export
