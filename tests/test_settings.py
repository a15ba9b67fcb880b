import pytest

from plscale.errors import UserError
from plscale.lab.settings import flatten, parse_assignment, resolve

DEFAULTS = {"seed": 0, "train": {"steps": 10, "lr": 0.1, "fast": False}, "ds": {"stage": 0}}


def test_assignments_parse_yaml_scalars():
    assert parse_assignment("train.lr=3e-4") == ("train.lr", 3e-4)
    assert parse_assignment("train.fast=true") == ("train.fast", True)
    assert parse_assignment("name=abc") == ("name", "abc")


@pytest.mark.parametrize("text", ["foo", "=3", "a..b=1", ".a=1"])
def test_malformed_assignment_is_a_user_error(text):
    with pytest.raises(UserError, match="key=value"):
        parse_assignment(text)


def test_resolve_applies_defaults_then_variant_then_sets():
    settings = resolve(DEFAULTS, {"ds.stage": 2, "train.steps": 5}, ["train.steps=7", "train.lr=1"])
    assert settings == {"seed": 0, "train": {"steps": 7, "lr": 1.0, "fast": False}, "ds": {"stage": 2}}
    assert isinstance(settings["train"]["lr"], float)
    assert DEFAULTS["train"]["steps"] == 10  # defaults untouched


def test_unknown_key_names_the_nearest():
    with pytest.raises(UserError, match="train.steps"):
        resolve(DEFAULTS, {}, ["train.stepz=3"])


@pytest.mark.parametrize("text, word", [("train.steps=abc", "number"), ("train.fast=3", "true or false")])
def test_type_mismatch_is_a_user_error(text, word):
    with pytest.raises(UserError, match=word):
        resolve(DEFAULTS, {}, [text])


def test_flatten():
    assert flatten(DEFAULTS) == {"seed": 0, "train.steps": 10, "train.lr": 0.1, "train.fast": False,
                                 "ds.stage": 0}


def test_a_parallel_degree_of_world_takes_every_rank():
    from plscale.lab.labs import find
    from plscale.lab.resolve import Topology, resolve_run

    lab, ring = find("ring-attention")
    assert lab.settings["parallel"]["cp"] == "world"
    assert resolve_run(lab, ring, Topology(4, "cpu")).settings["parallel"] == {"cp": 4, "ep": 1}
    moe = resolve_run(lab, lab.variant("moe-by-hand"), Topology(4, "cpu"))
    assert moe.settings["parallel"] == {"cp": 1, "ep": 4} and moe.ds_config["train_batch_size"] == 4 * 4
    # a number still works, and the rest is data parallel: cp 2 x dp 2
    two = resolve_run(lab, ring, Topology(4, "cpu"), sets=["parallel.cp=2"])
    assert two.settings["parallel"]["cp"] == 2 and two.ds_config["train_batch_size"] == 4 * 2
