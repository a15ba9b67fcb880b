"""Tokenizers: GPT-2's from the hub when reachable, else a byte-level BPE trained here on
the training text with `tokenizers`, cached under ~/.cache/plscale/tokenizers/."""

import hashlib
import os
from pathlib import Path
from typing import Iterable

from plscale.hardware import hub_reachable


def cache_dir() -> Path:
    return Path(os.environ.get("PLSCALE_CACHE", Path.home() / ".cache" / "plscale")) / "tokenizers"


def local_bpe(texts: list[str], vocab_size: int, name: str):
    """A byte-level BPE trained on `texts` (cached by content hash); returns a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "replace"))
    path = cache_dir() / f"{name}-bpe{vocab_size}-{digest.hexdigest()[:12]}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # several ranks may train at once: rename is atomic
    tokenizer.save(str(tmp))
    os.replace(tmp, path)
    return tokenizer


def gpt2_or_local(texts: Iterable[str], vocab_size: int, name: str, hub: bool = True):
    """(tokenizer, description). GPT-2's when the hub answers (and `hub`), else the local BPE."""
    if hub and hub_reachable():
        try:
            from tokenizers import Tokenizer
            return Tokenizer.from_pretrained("gpt2"), "GPT-2 tokenizer (hub)"
        except Exception as exc:  # the hub answered but the download failed
            print(f"warning: GPT-2 tokenizer from the hub failed ({exc}); training a local BPE")
    return local_bpe(list(texts), vocab_size, name), f"byte-level BPE ({vocab_size}) trained locally on {name}"
