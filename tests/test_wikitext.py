"""WikiText-2: finding the files, loading them, the labelled fallback, packing, sharding."""

import pytest
import torch

from plscale.datafiles import check
from plscale.datafiles.wikitext import find_wikitext
from plscale.errors import UserError
from plscale.rank.data import wikitext

LINES = [" = Valkyria Chronicles III = ", " ", " Senjō no Valkyria 3 is a tactical role @-@ playing game . ",
         " = = Gameplay = = ", " The game 's battle system , the BliTZ system , is carried over . "]


def write_splits(folder, pattern, splits=("train", "valid", "test"), repeat=40):
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        (folder / pattern.format(split)).write_text("\n".join(LINES * repeat) + "\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("pattern", ["wiki.{}.raw", "wiki.{}.tokens", "{}.txt"])
def test_finds_each_format(tmp_path, pattern):
    write_splits(tmp_path / "wikitext-2-raw", pattern)
    files = find_wikitext(tmp_path)
    assert files.train.name == pattern.format("train") and files.valid.name == pattern.format("valid")
    assert files.note == ""


def test_valid_and_test_only_trains_on_valid_and_says_so(tmp_path):
    write_splits(tmp_path, "{}.txt", ("valid", "test"))
    files = find_wikitext(tmp_path)
    assert (files.train.name, files.valid.name) == ("valid.txt", "test.txt")
    assert "training on valid, validating on test" in files.note


def test_missing_files_are_a_user_error(tmp_path):
    write_splits(tmp_path, "{}.txt", ("test",))
    with pytest.raises(UserError, match="has no WikiText-2 files"):
        find_wikitext(tmp_path)
    with pytest.raises(UserError, match="has no WikiText-2 files"):
        check("wikitext", tmp_path)


def test_local_folder_wins_and_is_tokenized(tmp_path, monkeypatch):
    write_splits(tmp_path, "wiki.{}.raw")
    monkeypatch.setenv("PLSCALE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PLSCALE_CACHE", str(tmp_path / "cache"))
    corpus = wikitext.load_text()
    assert corpus.real and "wiki.train.raw" in corpus.source
    tokens = wikitext.tokenize(corpus, vocab=300)
    assert tokens.vocab <= 300 and "trained locally" in tokens.tokenizer
    assert tokens.train.max() < tokens.vocab and len(tokens.train) > 1000
    blocks = wikitext.pack(tokens.train, seq=16)
    assert blocks.shape[1] == 17
    assert torch.equal(blocks[0, 16], blocks[1, 0])  # block i's last target is block i+1's first input


def test_encoded_ids_are_cached_by_tokenizer_and_text(tmp_path, monkeypatch):
    # the cache holds what the tokenizer itself encodes (tokenizers' own encode, line by line), and a
    # changed text is encoded anew rather than read from another text's cache
    write_splits(tmp_path, "wiki.{}.raw")
    monkeypatch.setenv("PLSCALE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PLSCALE_CACHE", str(tmp_path / "cache"))
    corpus = wikitext.load_text()
    first = wikitext.tokenize(corpus, vocab=300)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("ids-*.npy"))) == 1   # train and valid: one text here
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(next((tmp_path / "cache" / "tokenizers").glob("*-bpe300-*.json"))))
    eos = tokenizer.token_to_id("<|endoftext|>")
    by_hand = [i for line in corpus.valid if line.strip() for i in tokenizer.encode(line.strip()).ids + [eos]]
    again = wikitext.tokenize(corpus, vocab=300)
    assert again.valid.tolist() == first.valid.tolist() == by_hand
    changed = wikitext.Corpus(corpus.train, corpus.valid[:-3] + [" Valkyria Chronicles ends here . "], "x", True)
    assert wikitext.tokenize(changed, vocab=300).valid.tolist() != first.valid.tolist()


def test_offline_fallback_is_labelled(monkeypatch):
    monkeypatch.delenv("PLSCALE_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = wikitext.load_text()
    assert not corpus.real and corpus.source.startswith("OFFLINE FALLBACK") and "not WikiText-2" in corpus.source
    assert len(corpus.train) > 1000 and corpus.valid


def test_ranks_read_disjoint_shards_of_the_same_global_batch():
    blocks = torch.arange(100 * 9).view(100, 9)
    shards = [wikitext.Shards(blocks, micro=2, accum=3, rank=r, world=2, seed=0) for r in range(2)]
    for step in (0, 7, 8, 30):  # 8 steps per epoch: 30 is in the fourth epoch
        rows = [torch.cat(s.step(step)) for s in shards]
        assert all(len(r) == 6 for r in rows)
        ids = [set(r[:, 0].tolist()) for r in rows]
        assert not ids[0] & ids[1]
        again = wikitext.Shards(blocks, micro=2, accum=3, rank=0, world=2, seed=0)
        assert torch.equal(torch.cat(again.step(step)), rows[0])  # deterministic
    epoch = {int(x) for t in range(8) for s in shards for x in torch.cat(s.step(t))[:, 0]}
    assert len(epoch) == 96  # one epoch: every block at most once


def test_shared_wikitext(shared_data, monkeypatch, tmp_path):
    folder = shared_data("wikitext-2")
    files = find_wikitext(folder)
    assert (files.train.name, files.valid.name) == ("valid.txt", "test.txt")
    monkeypatch.setenv("PLSCALE_DATA_DIR", str(folder))
    corpus = wikitext.load_text()
    assert corpus.real and "no train split" in corpus.source
    assert len(corpus.train) == 3760 and len(corpus.valid) == 4358   # the official line counts
    words = sum(len(line.split()) + 1 for line in corpus.train)
    assert words == 217_646                                          # tokens + <eos>, as in the paper
