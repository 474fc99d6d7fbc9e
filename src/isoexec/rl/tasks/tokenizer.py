"""Tokenizers behind one interface: `encode(text)`, `encode_prompt(text)`, `decode(ids)` (text up to
the first end-of-sequence token), `vocab_size`, `EOS` and `eos_token_ids`.

`CharTokenizer` is the built-in toy's: one id per character, plus end-of-sequence. `CheckpointTokenizer`
is a Hugging Face checkpoint's own, read from its directory with transformers' AutoTokenizer when
transformers is installed (the `parity` extra), else from tokenizer.json with the tokenizers library.
A prompt goes through the checkpoint's chat template, as one user message followed by the generation
prompt, when the checkpoint has a template and `chat_template` is on; answers are encoded as plain text.

Nothing heavy is imported with this module (transformers only once a checkpoint's tokenizer is read):
the CLI imports the tasks with the RL config, before it needs torch.
"""

import json
from pathlib import Path

# The files a Hugging Face tokenizer can be read from; a directory with none of them has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class CharTokenizer:
    EOS = 0

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("tokenizer alphabet has repeated characters")
        self.alphabet = alphabet
        self._ids = {c: i + 1 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 1

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.EOS,)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as missing:
            raise ValueError(f"character {missing} is not in the task's alphabet") from None

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text up to the first end-of-sequence token."""
        out = []
        for i in ids:
            if i == self.EOS:
                break
            out.append(self.alphabet[i - 1] if 0 < i <= len(self.alphabet) else "�")
        return "".join(out)


class CheckpointTokenizer:
    """The tokenizer of the Hugging Face checkpoint in `directory`.

    eos_token_id: config.json's (`ModelSpec.eos_token_id`); without one, the tokenizer's eos token is
    EOS. A tokenizer eos token other than config.json's (a chat model's end of turn) also ends a
    completion: `eos_token_ids` holds both. backend: "transformers" or "tokenizers"; None takes
    transformers when it is importable. Raises ValueError, naming the directory, when the tokenizer
    cannot be read or a chat template would be needed that cannot be rendered.
    """

    def __init__(self, directory, *, eos_token_id: int | None = None, chat_template: bool = True, backend: str | None = None):
        self.directory = Path(directory)
        if backend is None:
            backend = "transformers" if _importable("transformers") else "tokenizers"
        if backend not in ("transformers", "tokenizers"):
            raise ValueError(f'tokenizer backend must be "transformers" or "tokenizers", got {backend!r}')
        if backend == "tokenizers" and chat_template and _has_chat_template(self.directory):
            raise ValueError(f"{directory} has a chat template, which needs transformers to render (pip install '.[parity]'); "
                             "--no-chat-template sends the prompts as raw text instead")
        self._hf = _read_transformers(self.directory) if backend == "transformers" else None
        self._fast = _read_tokenizer_json(self.directory) if backend == "tokenizers" else None
        self.uses_chat_template = chat_template and self._hf is not None and bool(self._hf.chat_template)
        own = self._own_eos_id()
        if eos_token_id is None and own is None:
            raise ValueError(f"{directory}: no end-of-sequence token (neither eos_token_id in config.json nor an eos_token "
                             "in the tokenizer's files)")
        self.EOS = eos_token_id if eos_token_id is not None else own
        self.eos_token_ids = tuple(dict.fromkeys(i for i in (self.EOS, own) if i is not None))

    @property
    def vocab_size(self) -> int:
        """Every token id the tokenizer can produce, added tokens included."""
        return len(self._hf) if self._hf is not None else self._fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Plain text (an answer), without special tokens."""
        if self._hf is not None:
            return self._hf.encode(text, add_special_tokens=False)
        return self._fast.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as the model is sent it: through the chat template, or raw with the tokenizer's
        special tokens (a BOS where it adds one)."""
        if not self.uses_chat_template:
            return self._hf.encode(text) if self._hf is not None else self._fast.encode(text).ids
        # As apply_chat_template(tokenize=True) does: the rendered text holds its special tokens already.
        rendered = self._hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return self._hf.encode(rendered, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """Text up to the first end-of-sequence token."""
        ids = list(ids)
        end = next((i for i, t in enumerate(ids) if t in self.eos_token_ids), len(ids))
        if self._hf is not None:
            return self._hf.decode(ids[:end], skip_special_tokens=False)
        return self._fast.decode(ids[:end], skip_special_tokens=False)

    def _own_eos_id(self) -> int | None:
        """The tokenizer's eos token, as its files name it."""
        if self._hf is not None:
            return self._hf.eos_token_id
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            token = _json(self.directory / name).get("eos_token")
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and self._fast.token_to_id(token) is not None:
                return self._fast.token_to_id(token)
        return None


def checkpoint_tokenizer(directory, spec, *, chat_template: bool = True, backend: str | None = None) -> CheckpointTokenizer:
    """The tokenizer of checkpoint `directory` for the model `spec` read from it: its eos from
    config.json, and no token id outside the model's vocabulary."""
    tokenizer = CheckpointTokenizer(directory, eos_token_id=spec.eos_token_id, chat_template=chat_template, backend=backend)
    if tokenizer.vocab_size > spec.vocab_size:
        raise ValueError(f"{directory}: its tokenizer has {tokenizer.vocab_size} tokens, more than the model's vocab_size {spec.vocab_size}")
    return tokenizer


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _json(path: Path) -> dict:
    """A JSON object file's contents; {} when it is absent or not one (the tokenizer loader then says why)."""
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _has_chat_template(directory: Path) -> bool:
    return bool(_json(directory / "tokenizer_config.json").get("chat_template")) or (directory / "chat_template.jinja").is_file()


def _first_line(error: Exception) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _read_transformers(directory: Path):
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{directory}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); prompts are encoded with the "
                         "checkpoint's own")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as error:  # a damaged file fails in whatever way the format's parser does
        raise ValueError(f"{directory}: unreadable tokenizer ({_first_line(error)})") from None


def _read_tokenizer_json(directory: Path):
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no tokenizer.json (without transformers the tokenizer is read from it with the "
                         "tokenizers library; pip install '.[parity]' reads the others)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"reading the tokenizer of {directory} needs transformers or tokenizers (pip install '.[parity]')") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises its own exception type for a malformed file
        raise ValueError(f"{path}: unreadable tokenizer ({_first_line(error)})") from None
