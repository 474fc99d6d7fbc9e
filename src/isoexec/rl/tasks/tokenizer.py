"""A character tokenizer: one id per character, plus end-of-sequence."""


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

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as missing:
            raise ValueError(f"character {missing} is not in the task's alphabet") from None

    def decode(self, ids: list[int]) -> str:
        """Text up to the first end-of-sequence token."""
        out = []
        for i in ids:
            if i == self.EOS:
                break
            out.append(self.alphabet[i - 1] if 0 < i <= len(self.alphabet) else "�")
        return "".join(out)
