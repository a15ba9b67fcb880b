from pathlib import Path

import pytest

from plscale.lab import labs
from plscale.errors import UserError
from plscale.lab.settings import resolve


def test_every_lab_manifest_is_complete():
    found = labs.all_labs()
    assert found, "no labs found"
    ids = [lab.id for lab in found]
    assert len(ids) == len(set(ids)), "duplicate lab ids"
    for lab in found:
        assert lab.entry_path.is_file(), lab.entry_path
        assert (lab.folder / "README.md").is_file(), f"{lab.id} has no README.md"
        assert lab.default_ranks in lab.allowed_ranks
        for variant in lab.variants.values():   # every variant's overrides name real settings
            resolve(lab.settings, variant.overrides)
            assert lab.entry_of(variant).is_file(), lab.entry_of(variant)
        for name in lab.sweep:
            lab.variant(name)


def test_global_names_are_unambiguous():
    seen = {}
    for lab in labs.all_labs():
        for name in [lab.id, *lab.aliases, *(a for v in lab.variants.values() for a in v.aliases)]:
            assert name not in seen, f"{name!r} names both {seen[name]} and {lab.id}"
            seen[name] = lab.id


def test_find_by_id_alias_number_and_folder():
    lab, variant = labs.find("mnist-pseudo-dp")
    assert variant.name == "default"
    assert labs.find("mnist-dp")[0].id == lab.id
    assert labs.find("1")[0].id == lab.id
    assert labs.find("01")[0].id == lab.id
    assert labs.find("01_mnist_pseudo_dp")[0].id == lab.id


def test_unknown_lab_lists_the_nearest():
    with pytest.raises(UserError, match="Did you mean: mnist"):
        labs.find("mnistt")


def test_unknown_variant_lists_the_variants():
    lab, _ = labs.find("mnist")
    with pytest.raises(UserError, match="Variants: default"):
        lab.variant("zero9")


def test_broken_manifest_is_a_user_error(tmp_path):
    folder = tmp_path / "01_broken"
    folder.mkdir()
    (folder / "lab.yaml").write_text("id: broken\ntitle: x\n")
    with pytest.raises(UserError, match="lacks sections, entry, ranks, settings"):
        labs.load_lab(folder)
    (folder / "lab.yaml").write_text("id: [unclosed\n")
    with pytest.raises(UserError, match="Cannot read"):
        labs.load_lab(folder)


def test_labs_root_is_the_repo_folder():
    assert labs.labs_root() == Path(__file__).resolve().parents[1] / "labs"


def test_a_variant_may_run_its_own_script(tmp_path):
    folder = tmp_path / "08_two_scripts"
    folder.mkdir()
    (folder / "lab.yaml").write_text(
        "id: two\ntitle: x\nsections: {a: [a]}\nentry: first.py\nranks: {default: 2, allowed: [2]}\n"
        "settings: {seed: 0}\ndefault_variant: one\n"
        "variants:\n  one: {}\n  two: {entry: second.py}\n  three: {entry: second.py}\n")
    lab = labs.load_lab(folder)
    first, second = folder / "first.py", folder / "second.py"
    assert lab.entry_of(lab.variant("one")) == first and lab.entry_of(lab.variant("two")) == second
    # launched by hand, a script runs the lab's default if it is its own, else its first variant
    assert lab.variant_for(None, first).name == "one"
    assert lab.variant_for(None, second).name == "two"
    assert lab.variant_for("three", second).name == "three"
    with pytest.raises(UserError, match="Variant 'one' of lab 'two' runs first.py, not second.py"):
        lab.variant_for("one", second)
