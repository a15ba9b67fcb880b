"""`--model hf:NAME_OR_PATH`: a Hugging Face model's config.json, found and read for the estimator
and the planner (plscale/predict/hf_config.py turns it into a shape).

    hf:path/to/model        a folder holding config.json (what save_pretrained writes)
    hf:path/config.json     the file itself
    hf:meta-llama/Llama-3.2-1B   a hub name: config.json alone is fetched, where the hub is
                            reachable and HF_HUB_OFFLINE is not set
"""

import json
from dataclasses import replace
from pathlib import Path

from plscale.errors import UserError
from plscale.hardware import hub_reachable
from plscale.predict.hf_config import end_of_text, folder_of, from_hf
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


def _hub_name(target: str) -> bool:
    """owner/name, or a bare name: not a path."""
    return not (target.startswith(("/", ".", "~")) or target.endswith(".json") or target.count("/") > 1)


def _config_file(target: str) -> Path:
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{path} has no config.json: give the folder save_pretrained wrote, or the config.json.")
        return path / "config.json"
    if path.is_file():
        return path
    if not _hub_name(target):
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


def check_training(settings: dict, topology) -> ModelConfig:
    """model.hf, checked on the host before any rank starts (a lab's check.py): a local folder with a
    causal LM's config.json, a tokenizer that fits the model's vocabulary, a sequence the model takes,
    and model states plus activations that fit each rank's memory by plscale's memory model."""
    source, seq = str(settings["model"]["hf"]).strip(), settings["model"]["seq"]
    if not source:
        raise UserError("model.hf names nothing: give the folder save_pretrained wrote (--set model.hf=models/NAME), "
                        "or drop it to train the preset.")
    folder = folder_of(source)
    if not folder.is_dir():
        typo = "/" in source and Path(source.split("/")[0]).expanduser().exists()   # models/<typo>: a local path
        hint = (f"download it first (huggingface-cli download {source} --local-dir models/{source.split('/')[-1]}) "
                f"and pass the folder" if _hub_name(source) and not typo else "give the folder save_pretrained wrote")
        raise UserError(f"model.hf {source}: no such folder: {hint}.")
    config, _ = read(f"{PREFIX}{folder}")
    if not 8 <= seq <= config.max_seq:
        raise UserError(f"model.seq {seq}: use 8 to {config.max_seq} for {source} (its max_position_embeddings).")
    _check_tokenizer(folder, config)
    _check_fits(settings, topology, config, source)
    return config


def _check_tokenizer(folder: Path, config: ModelConfig) -> None:
    file = folder / "tokenizer.json"
    if not file.is_file():
        if any((folder / name).is_file() for name in ("tokenizer.model", "vocab.json", "tokenizer_config.json")):
            raise UserError(f"{folder} has a tokenizer but no tokenizer.json (a fast tokenizer's file): save one with "
                            f"AutoTokenizer.from_pretrained(folder).save_pretrained(folder), or remove the tokenizer's "
                            f"files to train on the lab's own BPE.")
        return   # no tokenizer: the lab trains its BPE at the model's vocabulary size
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library's own words
        raise UserError(f"{file} is not a tokenizer the tokenizers library reads ({str(exc)[:120]}): save it again "
                        f"with the model's tokenizer, or remove it.")
    if tok.get_vocab_size() > config.vocab:
        raise UserError(f"{file} has {tok.get_vocab_size():,} tokens but the model's vocab_size is {config.vocab:,}: "
                        f"ids past it have no embedding; use the tokenizer the model was made with, or resize the "
                        f"model's embeddings (model.resize_token_embeddings) and save it again.")
    eos = end_of_text(json.loads((folder / "config.json").read_text()), tok.token_to_id)
    if eos is None:
        raise UserError(f"{folder}: neither config.json's eos_token_id nor the tokenizer names an end-of-text token "
                        f"to put between paragraphs: set eos_token_id in config.json.")
    if not 0 <= eos < min(config.vocab, tok.get_vocab_size()):
        raise UserError(f"{folder}/config.json: eos_token_id {eos} is outside the tokenizer's {tok.get_vocab_size():,} "
                        f"tokens and the model's vocab_size {config.vocab:,}: set it to the tokenizer's end-of-text id "
                        f"({tok.token_to_id('<|endoftext|>')} for '<|endoftext|>', if it has one).")


def _check_fits(settings: dict, topology, config: ModelConfig, source: str) -> None:
    """The lab's own question (memory.setup_from_ds_config on its generated DeepSpeed config), asked here."""
    from plscale.dsconfig.spec import DSSpec, build
    from plscale.hardware import memory_available
    from plscale.predict import memory
    from plscale.predict.units import GiB

    n = topology.world_size
    ds = build(DSSpec.from_dict({**settings["ds"], "world_size": n}))
    setup = memory.setup_from_ds_config(ds, n, config, settings["model"]["seq"])
    if settings.get("engine") == "fsdp2":   # FSDP2 shards every state as ZeRO-3 does
        setup = replace(setup, stage=3, persistence_threshold=0)
    need, have = memory.estimate(setup).total("device"), memory_available(topology.device)
    if have is None:
        return
    per_rank = have / n if topology.device == "cpu" else have   # the host's memory is shared by its ranks
    if need > per_rank:
        raise UserError(f"{source} needs about {need / GiB:.1f} GiB a rank here (model states and activations, "
                        f"ZeRO-{setup.stage} over {n}, {setup.precision}; plscale estimate memory --model hf:{source}) "
                        f"and a rank has {per_rank / GiB:.1f} GiB: raise ds.stage, lower model.seq or ds.micro_batch, "
                        f"or use more ranks.")
