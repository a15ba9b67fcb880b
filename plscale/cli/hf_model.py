"""`--model hf:NAME_OR_PATH`: a Hugging Face model's config.json, found and read for the estimator
and the planner (plscale/predict/hf_config.py turns it into a shape).

    hf:path/to/model        a folder holding config.json (what save_pretrained writes)
    hf:path/config.json     the file itself
    hf:meta-llama/Llama-3.2-1B   a hub name: config.json alone is fetched, where the hub is
                            reachable and HF_HUB_OFFLINE is not set
"""

import json
from pathlib import Path

from plscale.errors import UserError
from plscale.hardware import hub_reachable
from plscale.predict.hf_config import from_hf
from plscale.predict.presets import ModelConfig

PREFIX = "hf:"


def is_hf(model: str | None) -> bool:
    return bool(model) and model.startswith(PREFIX)


def read(model: str) -> tuple[ModelConfig, str]:
    """The shape, and one line saying what was read from where."""
    target = model[len(PREFIX):].strip()
    if not target:
        raise UserError("--model hf: names nothing: give a folder, a config.json or a hub name, e.g. "
                        "--model hf:meta-llama/Llama-3.2-1B.")
    file = _config_file(target)
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{file} is not a readable JSON config ({exc}): point --model hf: at a model's config.json.")
    if not isinstance(raw, dict):
        raise UserError(f"{file} holds no JSON object: point --model hf: at a model's config.json.")
    config, fields = from_hf(raw, str(file))
    return config, f"model: {model}, read from {file}: {', '.join(fields)}"


def caveat(config: ModelConfig) -> str:
    """What the activation model does not model for this shape, for the commands that print activations."""
    return ("activations: modelled as a Llama block of the same widths; GPT-2's GELU MLP and LayerNorms keep other "
            "tensors (not measured here)") if config.family == "gpt2" else ""


def _config_file(target: str) -> Path:
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{path} has no config.json: give the folder save_pretrained wrote, or the config.json.")
        return path / "config.json"
    if path.is_file():
        return path
    if target.startswith(("/", ".", "~")) or target.endswith(".json") or target.count("/") > 1:
        raise UserError(f"--model hf:{target}: no such folder or file.")
    if not hub_reachable():
        raise UserError(f"--model hf:{target} is no folder here, and the Hugging Face hub is offline (HF_HUB_OFFLINE, "
                        f"or no route): fetch its config where the hub is reachable (huggingface-cli download {target} "
                        f"config.json) and pass the folder.")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(target, "config.json"))
    except Exception as exc:  # not found, gated, no network after all: the hub's own words, shortened
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--model hf:{target}: the hub gave no config.json ({first[:160]}).")
