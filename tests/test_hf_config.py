"""A Hugging Face model's config.json read as a shape (plscale/predict/hf_config.py, plscale/cli/hf_model.py):
the parameter count equals transformers' own model built from the same config, for each family read;
`plscale estimate memory|checkpoint` and `plscale plan` take `--model hf:PATH`; what cannot be read is
refused in one line. Tiny configs are written here with save_pretrained: nothing downloads."""

import json
from dataclasses import replace

import pytest
import transformers

from conftest import run_cli
from plscale.predict.hf_config import from_hf
from plscale.predict import tensors
from plscale.predict.presets import param_count, preset
from plscale.predict.tensor_parallel import params_per_rank
from plscale.rank.models.llama import Llama

LLAMA = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "llama": transformers.LlamaConfig(**LLAMA),
    "llama-biased-tied": transformers.LlamaConfig(**LLAMA, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "mistral": transformers.MistralConfig(**LLAMA),
    "qwen2": transformers.Qwen2Config(**LLAMA),
    "qwen2-tied": transformers.Qwen2Config(**LLAMA, tie_word_embeddings=True),
    "gpt2": transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "gpt2-inner-untied": transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=3, n_head=4, n_positions=96,
                                                 n_inner=200, tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for name, config in CONFIGS.items():
        config.save_pretrained(root / name)
    return root


@pytest.mark.parametrize("name", CONFIGS)
def test_the_parameter_count_is_the_hugging_face_models(saved, name):
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name])
    shape, read = from_hf(json.loads((saved / name / "config.json").read_text()))
    assert param_count(shape) == model.num_parameters()  # tied weights counted once, as torch does
    assert params_per_rank(shape, 1).total == param_count(shape)
    assert (shape.hidden, shape.layers, shape.vocab) == (64, CONFIGS[name].num_hidden_layers, 1000)
    assert any(line.startswith("model_type") for line in read)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_tensor_in_transformers_order(saved, name):
    # ZeRO-1/2's partitions, FSDP2's groups and a checkpoint's records follow these: dim 0 and the rest of each
    # parameter, in model.parameters() order (a tied head once, at the embedding)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name])
    shape, _ = from_hf(json.loads((saved / name / "config.json").read_text()))
    built = [(p.shape[0], p[0].numel() if p.dim() > 1 else 1) for p in model.parameters()]
    assert tensors.parameters(shape) == built


def test_every_tensor_of_plscales_llama_in_its_order():
    for name in ("tiny", "small"):
        for config in (preset(name), replace(preset(name), tie_embeddings=False)):
            built = [(p.shape[0], p[0].numel() if p.dim() > 1 else 1) for p in Llama(config).parameters()]
            assert tensors.parameters(config) == built


def test_estimate_memory_and_checkpoint_read_the_config_and_say_what_they_read(saved):
    out = run_cli("estimate", "memory", "--model", f"hf:{saved / 'qwen2'}", "--gpus", "2", "--stage", "3", "--seq", "64")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "model_type = qwen2" in out.stdout and "biases: q k v" in out.stdout and "activations" in out.stdout
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS["qwen2"])
    as_json = run_cli("estimate", "memory", "--model", f"hf:{saved / 'qwen2' / 'config.json'}", "--gpus", "2",
                      "--stage", "3", "--seq", "64", "--precision", "fp32", "--json")
    terms = json.loads(as_json.stdout)["terms"]
    # fp32, ZeRO-3 over 2 ranks: a half of every tensor, and the tensors of at most 1e4 elements whole beside it
    # (stage3_param_persistence_threshold in plscale's configs), read off transformers' model
    persistent = sum(p.numel() for p in model.parameters() if p.numel() <= 10_000)
    assert terms["parameters"]["device"] == 4 * model.num_parameters() / 2 + 4 * persistent
    gpt2 = run_cli("estimate", "checkpoint", "--model", f"hf:{saved / 'gpt2'}")
    assert gpt2.returncode == 0 and "model_type = gpt2" in gpt2.stdout, gpt2.stdout + gpt2.stderr
    gpt2 = run_cli("estimate", "memory", "--model", f"hf:{saved / 'gpt2'}", "--gpus", "2", "--seq", "64")
    assert "activations: modelled as a Llama block of the same widths" in gpt2.stdout  # said where it is not exact
    assert "modelled as a Llama block" not in out.stdout  # Qwen2's block is the Llama's


def test_plan_takes_a_hugging_face_model(saved):
    out = run_cli("plan", "--model", f"hf:{saved / 'llama'}", "--gpus", "8", "--gpu", "H100", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    plan = json.loads(out.stdout)
    assert plan["params"] == transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).num_parameters()
    assert "read from" in out.stderr and "num_key_value_heads = 2" in out.stderr


@pytest.mark.parametrize("config, message", [
    (transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             architectures=["BertForMaskedLM"]), "is a BertForMaskedLM, not a causal language model"),
    (transformers.MixtralConfig(**LLAMA, num_local_experts=4), "is a mixture of experts (num_local_experts = 4)"),
    (transformers.FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
     "has model_type 'falcon': plscale reads llama, mistral, qwen2 and gpt2 configs"),
])
def test_what_it_cannot_read_is_refused_in_one_line(tmp_path, quick_cli, config, message):
    config.save_pretrained(tmp_path / "model")
    out = quick_cli("estimate", "memory", "--model", f"hf:{tmp_path / 'model'}")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_missing_config_or_an_offline_hub_name_fails_in_one_line(tmp_path, quick_cli):
    (tmp_path / "empty").mkdir()
    out = quick_cli("estimate", "memory", "--model", f"hf:{tmp_path / 'empty'}")
    assert out.returncode == 2 and "has no config.json: give the folder save_pretrained wrote" in out.stderr
    (tmp_path / "bad.json").write_text("{oops")
    out = quick_cli("plan", "--model", f"hf:{tmp_path / 'bad.json'}", "--gpus", "8", "--gpu", "H100")
    assert out.returncode == 2 and "is not a readable JSON config" in out.stderr
    out = quick_cli("estimate", "memory", "--model", "hf:meta-llama/Llama-3.2-1B", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and "the Hugging Face hub is offline" in out.stderr, out.stderr
    out = quick_cli("estimate", "memory", "--model", f"hf:{tmp_path / 'llama'}", "--vocab", "100")
    assert out.returncode == 2 and "a Hugging Face config names its own: drop --vocab" in out.stderr


def test_plan_prints_the_lab_command_for_its_best_layout_and_the_lab_takes_it(saved, quick_cli):
    out = run_cli("plan", "--model", f"hf:{saved / 'llama'}", "--gpus", "2", "--gpu", "H100", "--seq", "64",
                  "--global-batch", "16")
    assert out.returncode == 0, out.stdout + out.stderr
    [command] = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("plscale lab run zero")]
    assert f"--set model.hf={saved / 'llama'}" in command and "--gpus 2" in command
    assert "plscale slurm submit zero" in out.stdout and "plscale runpod run zero" in out.stdout
    # the command as printed, with the run's data on CPU ranks and --dry-run: the lab's host-side checks pass
    argv = command.split()[1:] + ["--cpu", "--dry-run"]
    dry = quick_cli(*argv)
    assert dry.returncode == 0, dry.stdout + dry.stderr
