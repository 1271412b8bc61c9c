"""UI-format workflow (what users drag in) -> API prompt (what POST /prompt takes), checked against
/object_info: unknown node types and widget values outside their type, range or options raise."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTE_TYPES = {"Note", "MarkdownNote"}  # frontend-only nodes, never sent to the server
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def load_workflows() -> list[Path]:
    return sorted((ROOT / "workflows").glob("*.json"))


class WorkflowError(ValueError):
    pass


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(v).split(".") if x.isdigit())


def not_made_for(wf: dict, version: str | None) -> str | None:
    """Why workflow `wf` is not meant for ComfyUI `version` (its extra.psa_comfyui {"min", "max"}: a core node's
    inputs changed between versions, e.g. Train LoRA's), else None."""
    rng = (wf.get("extra") or {}).get("psa_comfyui") or {}
    if version is None or not rng:
        return None
    v = _vtuple(version)
    if "min" in rng and v < _vtuple(rng["min"]):
        return f"made for ComfyUI >= {rng['min']}, this server is {version}"
    if "max" in rng and v > _vtuple(rng["max"]):
        return f"made for ComfyUI <= {rng['max']}, this server is {version}"
    return None


def _options(spec) -> list | None:
    if isinstance(spec[0], list):
        return spec[0]
    if spec[0] == "COMBO":
        return (spec[1] if len(spec) > 1 else {}).get("options")
    return None


def _is_widget(spec) -> bool:
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if opts.get("forceInput"):
        return False
    return isinstance(spec[0], list) or spec[0] in WIDGET_TYPES


def check_value(node: str, name: str, spec, value) -> None:
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    choices = _options(spec)
    where = f"node {node} input {name!r}"
    if choices is not None:
        if value not in choices:
            raise WorkflowError(f"{where}: {value!r} is not one of {choices[:12]}")
        return
    kind = spec[0]
    if kind == "BOOLEAN":
        if not isinstance(value, bool):
            raise WorkflowError(f"{where}: {value!r} is not a boolean")
    elif kind == "STRING":
        if not isinstance(value, str):
            raise WorkflowError(f"{where}: {value!r} is not a string")
    elif kind in ("INT", "FLOAT"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "INT" and value != int(value)):
            raise WorkflowError(f"{where}: {value!r} is not {kind}")
        if "min" in opts and value < opts["min"]:
            raise WorkflowError(f"{where}: {value} < min {opts['min']}")
        if "max" in opts and value > opts["max"]:
            raise WorkflowError(f"{where}: {value} > max {opts['max']}")


def workflow_to_prompt(wf: dict, object_info: dict) -> dict:
    links = {l[0]: (l[1], l[2]) for l in wf.get("links", [])}
    prompt = {}
    for node in wf["nodes"]:
        typ = node["type"]
        if typ in NOTE_TYPES or node.get("mode", 0) in (2, 4):
            continue
        if typ not in object_info:
            raise WorkflowError(f"node {node['id']}: unknown node type {typ!r}")
        info = object_info[typ]
        inputs = {}
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                src, slot = links[inp["link"]]
                inputs[inp["name"]] = [str(src), slot]
        values = list(node.get("widgets_values") or [])
        pos = 0
        for section in ("required", "optional"):
            for name in info["input_order"].get(section, []):
                spec = info["input"][section][name]
                if not _is_widget(spec) or name in inputs:
                    continue
                if pos >= len(values):
                    if section == "optional":
                        continue
                    raise WorkflowError(f"node {node['id']} ({typ}): no widget value for {name!r}")
                value = values[pos]
                pos += 1
                check_value(f"{node['id']} ({typ})", name, spec, value)
                inputs[name] = value
                opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                if opts.get("control_after_generate") or name in ("seed", "noise_seed"):
                    # the frontend stores the seed's "randomize"/"fixed" right after it (for inputs named seed
                    # or noise_seed even without the flag, e.g. Train LoRA's seed)
                    pos += 1
        if pos != len(values):
            raise WorkflowError(f"node {node['id']} ({typ}): {len(values)} widget values, {pos} expected")
        for section in ("required",):
            for name in info["input_order"].get(section, []):
                if name not in inputs:
                    raise WorkflowError(f"node {node['id']} ({typ}): required input {name!r} not connected")
        prompt[str(node["id"])] = {"class_type": typ, "inputs": inputs}
    return prompt
