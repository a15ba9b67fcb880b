"""Where a dataset comes from, in order: a local folder (--data-dir or PLSCALE_DATA_DIR),
the Hugging Face hub (when it answers), or a built-in offline stand-in that says so."""

from plscale.datafiles import data_dir
from plscale.hardware import hub_reachable


def first_available(name: str, local, hub, fallback):
    """local(folder), else hub(), else fallback(); a failed hub download falls back loudly."""
    folder = data_dir()
    if folder is not None:
        return local(folder)
    if hub_reachable():
        try:
            return hub()
        except Exception as exc:  # the hub answered but the download failed
            print(f"warning: {name} from the hub failed ({exc}); using the offline fallback")
    return fallback()
