"""WikiText-2 as packed token blocks, each rank reading its own shard of every batch.

Where the text comes from, in order: a local folder (`--data-dir` / PLSCALE_DATA_DIR, see
plscale/datafiles/wikitext.py for the file names), the Hugging Face hub through
`datasets` (wikitext-2-raw-v1, cached by `datasets`), and offline with neither, Python's
own bundled reference text (pydoc_data), clearly labelled as not being WikiText-2.
Tokenizer: GPT-2's from the hub when reachable, else a byte-level BPE trained here on the
training text (plscale.rank.data.bpe, cached).
"""

import hashlib
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from plscale.datafiles.wikitext import find_wikitext
from plscale.errors import UserError
from plscale.rank.data.bpe import cache_dir, gpt2_or_local
from plscale.rank.data.sources import first_available

FALLBACK = (f"OFFLINE FALLBACK: Python {sys.version_info.major}.{sys.version_info.minor}'s bundled reference text "
            f"(pydoc_data.topics, which each Python version rewrites), not WikiText-2 "
            f"(set --data-dir to WikiText-2 files for the real thing)")


@dataclass
class Corpus:
    train: list[str]    # lines of text
    valid: list[str]
    source: str         # where it came from, for the output and summary.json
    real: bool          # False for the offline fallback


@dataclass
class Tokens:
    train: np.ndarray   # int32 token ids, the whole split in one stream
    valid: np.ndarray
    vocab: int
    tokenizer: str      # which tokenizer, for the output


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def from_folder(folder) -> Corpus:
    files = find_wikitext(folder)
    note = f"; {files.note}" if files.note else ""
    return Corpus(_lines(files.train), _lines(files.valid),
                  f"WikiText-2 from {files.train.name} / {files.valid.name} in {files.train.parent}{note}", True)


def from_hub() -> Corpus:
    import datasets

    ds = datasets.load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1")
    return Corpus(ds["train"]["text"], ds["validation"]["text"],
                  "WikiText-2 from the Hugging Face hub (wikitext-2-raw-v1)", True)


def offline_fallback() -> Corpus:
    import pydoc_data.topics

    paragraphs = [p for text in pydoc_data.topics.topics.values() for p in text.split("\n\n") if p.strip()]
    cut = len(paragraphs) * 9 // 10
    return Corpus(paragraphs[:cut], paragraphs[cut:], FALLBACK, False)


def load_text() -> Corpus:
    return first_available("WikiText-2", from_folder, from_hub, offline_fallback)


def tokenize(corpus: Corpus, vocab: int, own=None, hub: bool = True) -> Tokens:
    """Rank 0 trains (or loads) the tokenizer and encodes the text first, caching both; the other
    ranks then read the caches (8 ranks encoding the same text at once on 2 cores took 6 s).
    `own`: a model's own tokenizer instead, (tokenizers.Tokenizer, description, end-of-text id);
    `hub` False: never GPT-2's from the hub (50,257 ids: a model of a fixed, smaller vocabulary)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank != 0:
        dist.barrier()
    label = "wikitext-2" if corpus.real else "the offline fallback text"
    if own:
        tokenizer, name, eos = own
    else:
        tokenizer, name = gpt2_or_local((line for line in corpus.train if line.strip()), vocab, label, hub)
        eos = tokenizer.token_to_id("<|endoftext|>")
    train, valid = (_encoded(tokenizer, lines, eos) for lines in (corpus.train, corpus.valid))
    if rank == 0 and dist.is_initialized():
        dist.barrier()
    return Tokens(train, valid, tokenizer.get_vocab_size(), name)


def _encoded(tokenizer, lines: list[str], eos: int) -> np.ndarray:
    """One stream of ids: each non-blank line, then end-of-text. Cached by the tokenizer's and the
    text's content, so a rank (or a later run) that finds it reads instead of encoding."""
    digest = hashlib.sha256(tokenizer.to_str().encode() + str(eos).encode())
    for line in lines:
        digest.update(line.encode("utf-8", "replace") + b"\n")
    path = cache_dir() / f"ids-{digest.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    ids = []
    for enc in tokenizer.encode_batch([line.strip() for line in lines if line.strip()]):
        ids += enc.ids + [eos]
    ids = np.asarray(ids, dtype=np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")   # ranks on other nodes may write at once: rename is atomic
    with open(tmp, "wb") as f:
        np.save(f, ids)
    os.replace(tmp, path)
    return ids


def pack(ids: np.ndarray, seq: int) -> torch.Tensor:
    """Fixed-length blocks of seq + 1 tokens (inputs block[:-1], targets block[1:]), no padding."""
    n = (len(ids) - 1) // seq
    starts = np.arange(n) * seq
    return torch.from_numpy(np.stack([ids[s:s + seq + 1] for s in starts]).astype(np.int64))


class Shards:
    """Global batch t is the same B = micro * accum * world blocks on every rank and in every
    run with this seed; rank r reads rows [r * micro * accum, (r + 1) * micro * accum)."""

    def __init__(self, blocks: torch.Tensor, micro: int, accum: int, rank: int, world: int, seed: int):
        self.blocks, self.micro, self.accum, self.rank, self.world = blocks, micro, accum, rank, world
        self.per_rank = micro * accum
        self.global_batch = self.per_rank * world
        if len(blocks) < self.global_batch:
            raise UserError(f"The training text makes {len(blocks)} blocks, fewer than one global batch of "
                            f"{self.global_batch} (micro x accumulation x ranks): lower ds.micro_batch or "
                            f"ds.grad_accum, or use more data (--data-dir).")
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.epoch_steps = torch.randperm(len(blocks), generator=self.generator), len(blocks) // self.global_batch

    def step(self, t: int) -> list[torch.Tensor]:
        """This rank's micro-batches of global step t: `accum` tensors of (micro, seq + 1)."""
        epoch, i = divmod(t, self.epoch_steps)
        while epoch >= len(self.order) // len(self.blocks):  # a fresh permutation per epoch
            self.order = torch.cat([self.order, torch.randperm(len(self.blocks), generator=self.generator)])
        start = epoch * len(self.blocks) + i * self.global_batch + self.rank * self.per_rank
        rows = self.order[start:start + self.per_rank]
        return list(self.blocks[rows].split(self.micro))


def replica_batches(blocks: torch.Tensor, micro: int, accum: int, seed: int, device, replicas: int, mine: int):
    """batch(step, replica=mine): that data-parallel replica's micro-batches of a step, as (tokens,
    targets) on `device`. Every rank of a replica (its tp, cp or ep ranks) reads the same ones;
    the dense reference reads every replica's (plscale/rank/against_dense.py: every_replica).

        batch = wikitext.replica_batches(blocks, micro, accum, seed, dev, dp, mesh.rank_in("dp"))
    """
    shards = [Shards(blocks, micro, accum, r, replicas, seed) for r in range(replicas)]

    def batch(step: int, replica: int = mine) -> list:
        return [(b[:, :-1].to(device), b[:, 1:].to(device)) for b in shards[replica].step(step)]
    return batch


def eval_shard(blocks: torch.Tensor, rank: int, world: int, limit: int) -> torch.Tensor:
    """This rank's share of the first `limit` validation blocks."""
    return blocks[:limit][rank::world]
