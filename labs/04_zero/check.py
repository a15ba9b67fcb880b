"""Host-side checks of the ZeRO lab's settings (no torch): fail in one line before launch."""

from plscale.errors import UserError
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    config = preset(settings["model"]["preset"])  # an unknown preset names the nearest
    seq = settings["model"]["seq"]
    if not 8 <= seq <= config.max_seq:
        raise UserError(f"model.seq {seq}: use 8 to {config.max_seq} for preset {settings['model']['preset']!r}.")
    if settings["train"]["steps"] < 1:
        raise UserError(f"train.steps {settings['train']['steps']}: use 1 or more.")
    if settings["memory"]["census_step"] < 0:
        raise UserError(f"memory.census_step {settings['memory']['census_step']}: use 0 or more (the step whose "
                        f"first micro-batch is counted; 1 has optimizer states).")
    for key, example in (("tolerance", 0.05), ("term_tolerance", 0.02)):
        if not 0 < settings["memory"][key] < 1:
            raise UserError(f"memory.{key} {settings['memory'][key]}: use a fraction such as {example}.")
    if settings["data"]["val_blocks"] < 1:
        raise UserError(f"data.val_blocks {settings['data']['val_blocks']}: use 1 or more.")
