"""The model a lab trains, as its settings choose: plscale's Llama of a preset (model.preset), or a
Hugging Face causal LM from a folder (model.hf), with the tokens it reads.

    tokens, config, make, about = chosen.model(S, corpus)
    model = make()          # the same weights at every call and on every rank (seeded); make(meta=True): shapes only

`config` is the shape plscale/predict computes the run's memory, FLOPs and collectives from: the
preset's (with the local tokenizer's vocabulary), or the one read from the model's config.json
(plscale.predict.hf_config). A Hugging Face model reads the text with its own tokenizer where its
folder has one (tokenizer.json), else with the lab's local BPE trained at the model's vocabulary.
"""

from dataclasses import replace

import torch

from plscale.predict.presets import preset
from plscale.rank.data import wikitext
from plscale.rank.models import hf
from plscale.rank.models.llama import Llama


def model(S: dict, corpus: wikitext.Corpus):
    source, seed = S["model"].get("hf"), S["seed"]
    dropout = S["model"].get("dropout", 0.0)   # lab 04 has none, as plscale's Llama: a model's own are set to 0
    if source:
        config = hf.shape(source)
        tokens = wikitext.tokenize(corpus, config.vocab, own=hf.tokenizer(source), hub=False)   # ids < its vocab
        kind = "weights" if hf.has_weights(source) else f"initialised from its config, seed {seed}"
        return tokens, config, lambda meta=False: hf.build(source, seed, dropout, meta), \
            f"{source} ({hf.model_type(source)}, transformers' modules; {kind})"
    tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
    config = replace(preset(S["model"]["preset"]).with_vocab(tokens.vocab), dropout=dropout)

    def make(meta: bool = False) -> Llama:
        if meta:
            with torch.device("meta"):
                return Llama(config)
        torch.manual_seed(seed)
        return Llama(config)
    return tokens, config, make, f"Llama-shaped {S['model']['preset']!r}"
