"""A small Hugging Face checkpoint with a tokenizer of its own, built by the test (no hub access): a
word-level tokenizer over single characters (tokenizers library) saved as tokenizer.json, a
tokenizer_config.json naming its eos token and, by default, a small jinja chat template, and a tiny
Qwen3 of random weights whose vocabulary and eos are the tokenizer's."""

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from isoexec.model import dense_spec, init_random, save

EOS, USER, ASSISTANT = "<eos>", "<|user|>", "<|assistant|>"
SPECIALS = (EOS, USER, ASSISTANT)
CHARACTERS = "0123456789+=? abcdefghijklmnopqrstuvwxyz"
UNKNOWN = "<unk>"
TEMPLATE = ("{% for message in messages %}" + USER + "{{ message['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}")
MAX_POSITION_EMBEDDINGS = 64


def build_tokenizer() -> Tokenizer:
    """One token per character (so answers decode exactly), the specials first: <eos> is id 0."""
    vocab = {token: i for i, token in enumerate([*SPECIALS, *CHARACTERS, UNKNOWN])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer


def write_checkpoint(directory, *, chat_template: bool = True, seed: int = 0, tokenizer_files: bool = True) -> Path:
    """config.json + model.safetensors (bfloat16, as checkpoints ship) + the tokenizer's files."""
    directory = Path(directory)
    tokenizer = build_tokenizer()
    spec = dense_spec(architecture="Qwen3ForCausalLM", vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope_theta=10_000.0, max_position_embeddings=MAX_POSITION_EMBEDDINGS, tie_word_embeddings=True,
                     dtype="bfloat16", eos_token_id=tokenizer.token_to_id(EOS))
    save(init_random(spec, seed), directory)
    if tokenizer_files:
        tokenizer.save(str(directory / "tokenizer.json"))
        # The class named, as checkpoints do: else transformers would build Qwen3's own pipeline around the vocabulary.
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, **({"chat_template": TEMPLATE} if chat_template else {})}
        (directory / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return directory


def write_data(path, rows) -> Path:
    """A JSONL file of {"prompt", "answer"} objects."""
    path = Path(path)
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows), "utf-8")
    return path
