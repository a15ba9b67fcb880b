"""IMDB movie reviews (positive/negative), from (in order) a local folder (aclImdb layout or
CSV, see plscale/datafiles/imdb.py), the Hugging Face hub through `datasets` (cached), or,
offline with neither, a small built-in set of template reviews that is clearly labelled
as not being IMDB. Then tokenized, truncated and padded to a fixed length.
"""

import random
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plscale.datafiles.imdb import find_imdb, read_split
from plscale.rank.data.sources import first_available
from plscale.rank.data.bpe import gpt2_or_local


@dataclass
class Reviews:
    texts: list[str]
    labels: list[int]   # 1 = positive


@dataclass
class Imdb:
    train: Reviews
    test: Reviews
    source: str         # where the data came from, for the output and summary.json
    real: bool          # False for the offline fallback


def from_folder(folder) -> Imdb:
    found = find_imdb(folder, check=False)  # read_split checks as it reads
    train, test = (Reviews(*read_split(found, split)) for split in ("train", "test"))
    return Imdb(train, test, f"IMDB reviews ({found['layout']}) in {folder}", True)


def from_hub() -> Imdb:
    import datasets

    ds = datasets.load_dataset("stanfordnlp/imdb")
    split = lambda name: Reviews(list(ds[name]["text"]), [int(v) for v in ds[name]["label"]])
    return Imdb(split("train"), split("test"), "IMDB from the Hugging Face hub (stanfordnlp/imdb)", True)


def offline_fallback() -> Imdb:
    return Imdb(template_reviews(2000, seed=1), template_reviews(500, seed=2),
                "OFFLINE FALLBACK: 2,500 built-in template reviews, not IMDB "
                "(set --data-dir to IMDB CSV or aclImdb files for the real thing)", False)


def load(seed: int = 0, train_samples: int = 0, test_samples: int = 0) -> Imdb:
    """Shuffled (files are often sorted by label) and cut to the first N samples (0 = all)."""
    data = first_available("IMDB", from_folder, from_hub, offline_fallback)
    for split, limit in ((data.train, train_samples), (data.test, test_samples)):
        order = list(range(len(split.labels)))
        random.Random(seed).shuffle(order)
        order = order[:limit] if limit > 0 else order
        split.texts, split.labels = [split.texts[i] for i in order], [split.labels[i] for i in order]
    return data


def tokenizer(texts: list[str], vocab_size: int):
    """(tokenizer, description): rank 0 trains (or downloads) it first, the others then read
    the cache instead of training the same BPE at the same time."""
    first = dist.is_initialized() and dist.get_rank() == 0
    if dist.is_initialized() and not first:
        dist.barrier()
    result = gpt2_or_local(texts, vocab_size, "imdb")
    if first:
        dist.barrier()
    return result


def encode(tok, texts: list[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (n, max_len >= 1): truncated, padded on the right; mask 1 = real token."""
    pad = tok.token_to_id("<pad>")
    pad = 0 if pad is None else pad
    tok.enable_truncation(max_len)
    tok.enable_padding(length=max_len, pad_id=pad)
    encodings = tok.encode_batch([t.replace("<br />", " ") for t in texts])
    ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool)
    return ids, mask


# ---- the offline fallback: template reviews, labelled as such --------------------------
_GOOD = ["wonderful", "brilliant", "moving", "superb", "delightful", "gripping", "charming", "excellent",
         "beautiful", "clever", "touching", "memorable"]
_BAD = ["boring", "awful", "dull", "clumsy", "tedious", "terrible", "lifeless", "predictable", "weak",
        "dreadful", "messy", "forgettable"]
_THINGS = ["acting", "plot", "script", "soundtrack", "camera work", "ending", "cast", "dialogue", "pacing",
           "direction", "story", "lead actor"]
_VERDICT = {1: ["I would watch it again.", "Highly recommended.", "A real treat.", "Ten out of ten."],
            0: ["I want my two hours back.", "Avoid it.", "A waste of time.", "One star is generous."]}
_OPEN = ["I saw this film last week.", "My friends dragged me to this one.", "This movie came out in 1998.",
         "I watched it on a rainy Sunday.", "The trailer promised a lot."]


def template_reviews(n: int, seed: int) -> Reviews:
    """n short reviews whose sentiment sits in the adjectives, with a contrary aside in one
    review out of three ("the ending was dull, but ...") so that a word count alone errs."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randint(0, 1)
        main, other = (_GOOD, _BAD) if label else (_BAD, _GOOD)
        words = [f"The {rng.choice(_THINGS)} was {rng.choice(main)}." for _ in range(rng.randint(2, 4))]
        if rng.random() < 1 / 3:
            words.insert(rng.randint(0, len(words)), f"Only the {rng.choice(_THINGS)} was {rng.choice(other)}.")
        texts.append(" ".join([rng.choice(_OPEN), *words, rng.choice(_VERDICT[label])]))
        labels.append(label)
    return Reviews(texts, labels)
