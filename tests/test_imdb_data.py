"""IMDB loaders on small local files (CSV, CSV.gz, aclImdb), the labelled offline fallback,
tokenization, and bad input: one clear line, exit 2."""

import gzip

import pytest

from plscale.datafiles.imdb import find_imdb, read_split
from plscale.errors import UserError

ROWS = [("1", "1", "A wonderful film, I loved it."), ("2", "0", "Dull, slow and far too long."),
        ("3", "1", 'Great cast, "great" fun, with a comma, or two.'), ("4", "0", "Awful.<br /><br />Avoid.")]


def write_csv(path, header="id,label,text", rows=ROWS):
    lines = [header] + [f'{i},{label},"{text.replace(chr(34), chr(34) * 2)}"' for i, label, text in rows]
    data = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def test_csv_and_gz_load_with_quotes(tmp_path):
    write_csv(tmp_path / "train.csv")
    write_csv(tmp_path / "test.csv.gz", rows=ROWS[:2])
    found = find_imdb(tmp_path)
    assert found["layout"] == "csv"
    texts, labels = read_split(found, "train")
    assert labels == [1, 0, 1, 0]
    assert texts[2] == 'Great cast, "great" fun, with a comma, or two.'
    assert read_split(found, "test") == ([r[2] for r in ROWS[:2]], [1, 0])


def test_csv_in_imdb_subfolder_with_word_labels(tmp_path):
    (tmp_path / "imdb").mkdir()
    rows = [(i, {"1": "pos", "0": "NEG"}[label], text) for i, label, text in ROWS]
    write_csv(tmp_path / "imdb" / "train.csv", header="id,LABEL,Text", rows=rows)
    write_csv(tmp_path / "imdb" / "test.csv", rows=rows)
    assert read_split(find_imdb(tmp_path), "train")[1] == [1, 0, 1, 0]


def test_aclimdb_layout(tmp_path):
    for split in ("train", "test"):
        for side, text in (("pos", "Loved it."), ("neg", "Hated it.")):
            folder = tmp_path / "aclImdb" / split / side
            folder.mkdir(parents=True)
            for k in range(3):
                (folder / f"{k}_{8 if side == 'pos' else 2}.txt").write_text(f"{text} #{k}")
    found = find_imdb(tmp_path)
    assert found["layout"] == "aclImdb"
    texts, labels = read_split(found, "test")
    assert labels == [0, 0, 0, 1, 1, 1] and texts[0] == "Hated it. #0" and texts[3] == "Loved it. #0"


@pytest.mark.parametrize("header,rows,message", [
    ("id,review,sentiment", ROWS, "needs a 'text' and a 'label' column"),
    ("id,label,text", ROWS[:1] + [("9", "3", "Three stars.")], "line 3: label '3' is not binary"),
    ("id,label,text", ROWS[:1] + [("9", "1", "   ")], "line 3: the review text is empty"),
    ("id,label,text", [], "has a header but no reviews"),
])
def test_bad_csv_is_a_user_error(tmp_path, header, rows, message):
    write_csv(tmp_path / "train.csv", header=header, rows=rows)
    write_csv(tmp_path / "test.csv")
    with pytest.raises(UserError, match=message):
        find_imdb(tmp_path)


def test_folder_without_reviews(tmp_path):
    write_csv(tmp_path / "train.csv")  # no test split
    with pytest.raises(UserError, match="has no IMDB reviews"):
        find_imdb(tmp_path)


def test_cli_bad_csv_one_line_exit_2(cli, tmp_path):
    write_csv(tmp_path / "train.csv", header="id,stars,text")
    write_csv(tmp_path / "test.csv")
    result = cli("lab", "run", "imdb", "--data-dir", tmp_path, "--steps", "1")
    assert result.returncode == 2
    assert "needs a 'text' and a 'label' column" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())  # nothing launched, nothing written


def test_rank_loader_shuffles_cuts_and_says_where(tmp_path, monkeypatch):
    from plscale.rank.data import imdb

    write_csv(tmp_path / "train.csv")
    write_csv(tmp_path / "test.csv")
    monkeypatch.setenv("PLSCALE_DATA_DIR", str(tmp_path))
    data = imdb.load(seed=0, train_samples=3)
    assert data.real and "csv" in data.source and str(tmp_path) in data.source
    assert len(data.train.labels) == 3 and len(data.test.labels) == 4
    pairs = {(t, label) for t, label in zip(data.train.texts, data.train.labels)}
    assert pairs <= {(t, int(label)) for _, label, t in ROWS}  # texts keep their labels when shuffled
    assert imdb.load(seed=0, train_samples=3).train.texts == data.train.texts  # same seed, same order


def test_offline_fallback_is_labelled_and_balanced(monkeypatch):
    from plscale.rank.data import imdb

    monkeypatch.delenv("PLSCALE_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = imdb.load()
    assert not data.real and data.source.startswith("OFFLINE FALLBACK") and "not IMDB" in data.source
    assert len(data.train.labels) == 2000 and len(data.test.labels) == 500
    assert 0.4 < sum(data.train.labels) / 2000 < 0.6


def test_encode_truncates_and_pads(tmp_path, monkeypatch):
    from plscale.rank.data import imdb

    monkeypatch.setenv("PLSCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reviews = imdb.template_reviews(200, seed=0)
    tok, description = imdb.tokenizer(reviews.texts, 300)
    assert "trained locally" in description
    ids, mask = imdb.encode(tok, ["short one", " ".join(["long"] * 100)], max_len=16)
    assert ids.shape == mask.shape == (2, 16)
    assert mask[1].all() and 0 < mask[0].sum() < 16           # truncated / padded
    assert (ids[0][~mask[0]] == tok.token_to_id("<pad>")).all()


def test_encoder_ignores_padding_and_pretrained_offline_is_a_user_error(monkeypatch):
    import torch

    from plscale.rank.models.encoder import EncoderClassifier, pretrained

    torch.manual_seed(0)
    model = EncoderClassifier(vocab=50, max_len=12, dim=16, layers=2, heads=4, ff=32).eval()
    ids = torch.randint(2, 50, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[0, 5:] = False
    other = ids.clone()
    other[0, 5:] = 1                                  # different tokens where the mask says padding
    with torch.no_grad():
        assert torch.allclose(model(ids, mask), model(other, mask), atol=1e-6)
        assert not torch.allclose(model(ids, mask)[0], model(ids, torch.ones_like(mask))[0])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants  # it reads HF_HUB_OFFLINE once, at import: maybe by an earlier test here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="model.init=pretrained: cannot load"):
        pretrained("distilbert-base-uncased")
