"""The checkpoint folder on its own (no DeepSpeed): sealing, verifying, falling back, deltas."""

import numpy as np
import pytest

from plscale.ckpt import delta, store
from plscale.errors import UserError


def write_partial(root, step, files):
    folder = store.partial_dir(root, store.tag_of(step))
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def seal(root, step, files, **meta):
    write_partial(root, step, files)
    return store.commit(root, store.tag_of(step), {"step": step, "kind": "full", **meta})


def test_commit_seals_and_moves_latest_last(tmp_path):
    seal(tmp_path, 5, {"a.pt": b"x" * 100})
    assert store.latest_tag(tmp_path) == "step000005"
    write_partial(tmp_path, 10, {"a.pt": b"y" * 100})  # a crash before commit: not visible
    assert store.latest_tag(tmp_path) == "step000005"
    assert [e.tag for e in store.entries(tmp_path)] == ["step000005"]
    store.commit(tmp_path, "step000010", {"step": 10, "kind": "full"})
    assert store.latest_tag(tmp_path) == "step000010"
    assert not (tmp_path / store.PARTIAL / "step000010").exists()
    manifest = store.read_manifest(tmp_path / "step000010")
    assert manifest["files"]["a.pt"]["bytes"] == 100 and manifest["step"] == 10


@pytest.mark.parametrize("damage, words", [
    (lambda p: p.write_bytes(p.read_bytes()[:50]), "truncated"),
    (lambda p: p.write_bytes(b"z" + p.read_bytes()[1:]), "corrupted"),
    (lambda p: p.unlink(), "missing"),
])
def test_damage_is_found_and_the_older_checkpoint_is_newest_valid(tmp_path, damage, words):
    seal(tmp_path, 5, {"a.pt": b"x" * 100})
    seal(tmp_path, 10, {"a.pt": b"y" * 100})
    damage(tmp_path / "step000010" / "a.pt")
    found = store.entries(tmp_path)
    assert [e.tag for e in found] == ["step000010", "step000005"]
    assert not found[0].valid and words in found[0].problems[0]
    assert found[1].valid


def test_a_folder_without_manifest_is_invalid(tmp_path):
    (tmp_path / "step000007").mkdir()
    (tmp_path / "step000007" / "a.pt").write_bytes(b"1")
    (entry,) = store.entries(tmp_path)
    assert not entry.valid and "manifest" in entry.problems[0]


def test_open_root_refuses_missing_folder_and_missing_latest(tmp_path):
    with pytest.raises(UserError, match="No checkpoint folder"):
        store.open_root(tmp_path / "nope")
    (tmp_path / "step000001").mkdir()
    with pytest.raises(UserError, match="no `latest`"):
        store.open_root(tmp_path)


def test_check_writable_names_the_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="ckpt.dir"):
        store.check_writable(blocker / "checkpoints")
    store.check_writable(tmp_path / "fine")  # creates it
    assert (tmp_path / "fine").is_dir()


def test_prune_keeps_the_newest_fulls_and_their_deltas(tmp_path):
    for step in (5, 10, 15):
        seal(tmp_path, step, {"a.pt": bytes([step]) * 10})
    write_partial(tmp_path, 20, {"a.pt.xor.z": b"d"})
    store.commit(tmp_path, "step000020", {"step": 20, "kind": "delta", "base": "step000015"})
    removed = store.prune(tmp_path, keep=2)
    assert removed == ["step000005"]
    assert [e.tag for e in store.entries(tmp_path)] == ["step000020", "step000015", "step000010"]


def test_delta_rebuilds_float_weights_exactly_and_smaller(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.02, 200_000).astype(np.float32)
    base, new = tmp_path / "base.bin", tmp_path / "new.bin"
    base.write_bytes(b"header" + weights.tobytes())
    updated = weights - 1e-3 * np.sign(rng.normal(size=weights.shape)).astype(np.float32) * np.abs(weights) * 0.01
    new.write_bytes(b"header" + updated.tobytes() + b"tail")  # a different length too
    blob = delta.encode(new, base)
    assert delta.decode(blob, base) == new.read_bytes()
    assert len(blob) < 0.8 * new.stat().st_size  # small relative updates leave the high bytes alone


def test_rebuild_of_a_delta_checkpoint_is_verified(tmp_path):
    seal(tmp_path, 5, {"a.pt": bytes(range(256)) * 40, "rng.pt": b"r" * 10})
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.pt").write_bytes(bytes((i + 1) % 256 for i in range(256)) * 40)
    (src / "new.pt").write_bytes(b"only here")
    originals = store.file_table(src)
    delta.encode_into(src, tmp_path / "step000005", store.partial_dir(tmp_path, "step000010"), list(originals))
    store.commit(tmp_path, "step000010", {"step": 10, "kind": "delta", "base": "step000005", "restores": originals})
    out = delta.rebuild(tmp_path / "step000010", tmp_path / "rebuilt")
    assert (out / "a.pt").read_bytes() == (src / "a.pt").read_bytes()
    assert (out / "new.pt").read_bytes() == b"only here"
    # a damaged base makes the delta invalid too
    (tmp_path / "step000005" / "a.pt").write_bytes(b"0" * 10240)
    assert any("base" in p for p in store.problems(tmp_path / "step000010"))


def test_prune_counts_only_up_to_latest_and_keeps_its_base(tmp_path):
    seal(tmp_path, 45, {"a.pt": b"stale, from a crashed attempt"})
    for step in (10, 30):
        seal(tmp_path, step, {"a.pt": bytes([step]) * 10})
    write_partial(tmp_path, 35, {"a.pt.xor.z": b"d"})
    store.commit(tmp_path, "step000035", {"step": 35, "kind": "delta", "base": "step000030"})
    assert store.prune(tmp_path, keep=1) == ["step000045", "step000010"]
    assert [e.tag for e in store.entries(tmp_path)] == ["step000035", "step000030"]
