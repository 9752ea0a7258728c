"""What a cell's model and its Trainer need to know of its data: the task.

Two kinds: `image` (classify an image of `channels` x `size` x `size` into one of `classes`) and
`text` (predict every next token of a window of `seq_len` tokens from a vocabulary of
`vocab_size` symbols: a sample is seq_len + 1 tokens, the input its first seq_len, the target its
last seq_len). No torch at import: the planning code reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IMAGE, TEXT = "image", "text"
KINDS = (IMAGE, TEXT)


@dataclass(frozen=True)
class Task:
    kind: str  # IMAGE or TEXT
    channels: int = 0  # image
    size: int = 0  # image: height == width
    classes: int = 0  # image
    vocab_size: int = 0  # text: the tokenizer's symbols
    seq_len: int = 0  # text: tokens a sample's input holds

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"task kind {self.kind!r} is not one of {KINDS}")

    @classmethod
    def image(cls, channels: int, size: int, classes: int) -> Task:
        return cls(IMAGE, channels=channels, size=size, classes=classes)

    @classmethod
    def text(cls, vocab_size: int, seq_len: int) -> Task:
        return cls(TEXT, vocab_size=vocab_size, seq_len=seq_len)

    @property
    def is_text(self) -> bool:
        return self.kind == TEXT

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens one sample trains on (its targets); None for images."""
        return self.seq_len if self.is_text else None

    @property
    def outputs(self) -> int:
        """Logits per position: the classes of an image, the vocabulary of a text."""
        return self.vocab_size if self.is_text else self.classes

    def input_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.seq_len) if self.is_text else (batch, self.channels, self.size, self.size)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        """The logits a model must return for a batch."""
        return (batch, self.seq_len, self.vocab_size) if self.is_text else (batch, self.classes)

    def example_batch(self, batch: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the right shapes and dtypes, random: for fake steps, FLOP counts and
        trials of a model, never for training."""
        import torch

        if self.is_text:
            x = torch.randint(0, self.vocab_size, (batch, self.seq_len + 1), device=device)
            return x[:, :-1], x[:, 1:]
        x = torch.randn(self.input_shape(batch), device=device)
        return x, torch.randint(0, self.classes, (batch,), device=device)
