"""Your own model in the labs: `--set model.hf=FOLDER` trains a Hugging Face causal LM (transformers'
AutoModelForCausalLM) in the ZeRO lab (DeepSpeed, FSDP2) and the checkpoint lab, on 2 CPU ranks, with
the labs' checks passing. Tiny Llama-, Qwen2- and GPT-2-shaped models are written here with
save_pretrained: nothing downloads. What cannot be trained is refused in one line before any rank starts."""

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from conftest import load_summary, only_run
from plscale.rank.data.wikitext import offline_fallback

SHAPE = dict(vocab_size=2048, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
# torchrun starts the ranks: the deepspeed launcher would add its runner and launch.py, each importing DeepSpeed
# (about 3 s of CPU and 5 s of waiting a run); lab 01's tests run it (test_lab_mnist.py)
QUICK = ["--gpus", "2", "--cpu", "--launcher", "torchrun", "--set", "model.seq=64", "--set", "data.val_blocks=8"]


def bpe(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(offline_fallback().train[:400], trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<unk>", "<|endoftext|>"], show_progress=False))
    return tok


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    transformers.LlamaConfig(**SHAPE).save_pretrained(root / "llama")            # config only: initialised
    transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True).save_pretrained(root / "qwen2")
    bpe(1000).save(str(root / "qwen2" / "tokenizer.json"))                       # its own tokenizer, smaller
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=2048, n_embd=64, n_layer=2, n_head=4,
                                                         n_positions=128)).save_pretrained(root / "gpt2")  # weights
    transformers.GPT2Config(vocab_size=2048, n_embd=64, n_layer=2, n_head=4,   # eos_token_id 50256: GPT-2's
                            n_positions=128).save_pretrained(root / "bad-eos")
    bpe(1000).save(str(root / "bad-eos" / "tokenizer.json"))
    transformers.Qwen2Config(**SHAPE).save_pretrained(root / "wide-tokenizer")
    bpe(2600).save(str(root / "wide-tokenizer" / "tokenizer.json"))
    transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, architectures=["BertForMaskedLM"]).save_pretrained(root / "bert")
    transformers.LlamaConfig(**{**SHAPE, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                                "num_attention_heads": 64, "num_key_value_heads": 8}).save_pretrained(root / "70b")
    (root / "empty").mkdir()
    return root


def ds_persistent(model, threshold=10_000) -> int:
    """Elements DeepSpeed's ZeRO-3 keeps whole (stage3_param_persistence_threshold, plscale's 1e4), from the model."""
    return sum(p.numel() for p in model.parameters() if p.numel() <= threshold)


@pytest.mark.e2e
def test_zero3_and_fsdp2_train_a_llama_from_its_config_alike(folders, cli):
    zero3 = cli("lab", "run", "zero3", "--steps", "3", "--set", f"model.hf={folders / 'llama'}", *QUICK)
    assert zero3.returncode == 0, zero3.stdout[-3000:] + zero3.stderr[-3000:]
    z = load_summary(only_run(cli.runs))
    assert z["passed"], z["checks"]
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SHAPE))
    assert z["params"] == model.num_parameters() and z["hf"] == str(folders / "llama")
    # ZeRO-3's parameters per rank, by DeepSpeed's rule read off the built model: its 1/2 share of every tensor,
    # and the small ones (q, k, v, o, the norms: 4096 elements or fewer) whole beside it
    expected = 4 * z["params"] / 2 + 4 * ds_persistent(model)
    assert z["memory"]["parameters"]["measured_bytes"] == [pytest.approx(expected, rel=1e-3)] * 2
    assert "activations" not in {k for k, v in z["memory"].items() if v.get("predicted_bytes")}  # Llama's count only
    assert "transformers' modules; initialised from its config, seed 0" in zero3.stdout

    for run in cli.runs.iterdir():
        run.rename(run.with_name("zero3-" + run.name))
    fsdp2 = cli("lab", "run", "fsdp2", "--steps", "3", "--set", f"model.hf={folders / 'llama'}", *QUICK)
    assert fsdp2.returncode == 0, fsdp2.stdout[-3000:] + fsdp2.stderr[-3000:]
    f = load_summary(next(r for r in cli.runs.iterdir() if not r.name.startswith("zero3-")))
    assert f["passed"], f["checks"]   # states and collectives against plscale/predict/fsdp.py, loss against dense
    # the same weights, batches and AdamW under DeepSpeed's ZeRO-3 and PyTorch's FSDP2: the same losses
    assert max(abs(a - b) / b for a, b in zip(f["losses"], z["losses"])) < 1e-5


@pytest.mark.e2e
def test_zero2_trains_qwen2_on_its_own_tokenizer(folders, cli):
    out = cli("lab", "run", "zero2", "--steps", "3", "--set", f"model.hf={folders / 'qwen2'}", *QUICK)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = load_summary(only_run(cli.runs))
    assert s["passed"], s["checks"]   # every model state on each rank, whole tensors at the partitions' edges
    assert f"{folders / 'qwen2'}'s own tokenizer (1,000 tokens)" in s["tokenizer"]
    assert s["model"]["qkv_bias"] and s["model"]["tie_embeddings"]


@pytest.mark.e2e
def test_fsdp2_trains_gpt2_from_its_weights(folders, cli):
    # named as ~/gpt2/config.json: the host and every rank read the same folder
    out = cli("lab", "run", "fsdp2", "--steps", "2", "--set", "model.hf=~/gpt2/config.json", *QUICK,
              env={"HOME": str(folders)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = load_summary(only_run(cli.runs))
    assert s["passed"], s["checks"]
    assert "(gpt2, transformers' modules; weights)" in out.stdout


@pytest.mark.e2e
def test_a_crashed_run_of_qwen2_resumes_bit_for_bit(folders, cli, quick_cli):
    out = cli("lab", "run", "ckpt-fault", "--gpus", "2", "--cpu", "--set", f"model.hf={folders / 'qwen2'}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = only_run(cli.runs)
    s = load_summary(run)
    assert s["passed"], s["checks"]
    assert "the steps trained again after the restart give the same losses, bit for bit" in \
        {c["name"] for c in s["checks"]}
    # its checkpoints are of this model: the preset is refused on the host, in one line, before any rank
    other = quick_cli("lab", "run", "ckpt", "--gpus", "2", "--cpu", "--set", f"ckpt.resume={run / 'checkpoints'}")
    assert other.returncode == 2 and "holds a checkpoint of another model (hf," in other.stderr, other.stderr


def test_the_loaded_model_is_the_saved_one_and_the_config_built_one_is_seeded(folders):
    from plscale.rank.models import hf

    saved = transformers.GPT2LMHeadModel.from_pretrained(folders / "gpt2").state_dict()
    loaded = hf.build(str(folders / "gpt2"), seed=0).hf.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    first, again = (hf.build(str(folders / "llama"), seed=3).state_dict() for _ in range(2))
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_model_without_tokenizer_never_reads_gpt2s_from_the_hub(folders, monkeypatch):
    # where the hub answers (a pod), GPT-2's 50,257 ids would not fit the model: the local BPE at its vocabulary
    from tokenizers import Tokenizer as HubTokenizer

    from plscale.rank.data import bpe
    from plscale.rank.models import chosen

    monkeypatch.setattr(bpe, "hub_reachable", lambda: True)
    monkeypatch.setattr(HubTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("GPT-2's tokenizer fetched"))
    tokens, config, _, _ = chosen.model({"model": {"hf": str(folders / "llama")}, "seed": 0}, offline_fallback())
    assert tokens.vocab <= config.vocab == 2048 and int(tokens.train.max()) < config.vocab


@pytest.mark.parametrize("lab, setting, said", [
    ("zero3", "empty", "has no config.json"),
    ("zero3", "nowhere", "no such folder: give the folder save_pretrained wrote"),
    ("zero3", "bert", "is a BertForMaskedLM, not a causal language model"),
    ("zero2", "wide-tokenizer", "tokenizer.json has 2,600 tokens but the model's vocab_size is 2,048"),
    ("zero3", "70b", "needs about"),
    ("ckpt", "bert", "not a causal language model"),
    ("tp", "llama", "model.hf: this lab's strategy code is written for plscale's own Llama"),
    ("zero2", "bad-eos", "eos_token_id 50256 is outside the tokenizer's 1,000 tokens"),
])
def test_what_cannot_be_trained_is_one_line_and_exit_2(folders, quick_cli, lab, setting, said):
    out = quick_cli("lab", "run", lab, "--gpus", "2", "--cpu", "--set", f"model.hf={folders / setting}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert not out.stdout.strip() and not quick_cli.runs.exists()   # before any rank, no run directory


def test_a_hub_name_is_downloaded_first(quick_cli):
    out = quick_cli("lab", "run", "zero2", "--cpu", "--set", "model.hf=Qwen/Qwen2.5-0.5B")
    assert out.returncode == 2 and "huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir models/Qwen2.5-0.5B" \
        in out.stderr, out.stderr


def test_a_sequence_past_gpt2s_positions_is_refused(folders, quick_cli):
    out = quick_cli("lab", "run", "zero2", "--cpu", "--set", f"model.hf={folders / 'gpt2'}", "--set", "model.seq=256")
    assert out.returncode == 2 and "model.seq 256: use 8 to 128" in out.stderr, out.stderr


@pytest.mark.parametrize("value, said", [("", "model.hf names nothing"),
                                         ("models/tiny-qwen", "no such folder: give the folder save_pretrained wrote")])
def test_an_empty_value_and_a_typo_in_a_local_path_are_said_so(tmp_path, quick_cli, value, said):
    (tmp_path / "models").mkdir()
    out = quick_cli("lab", "run", "zero2", "--cpu", "--set", f"model.hf={value}", cwd=tmp_path)
    assert out.returncode == 2 and said in out.stderr and "huggingface-cli" not in out.stderr, out.stderr
