"""Generated text: sentences of a small grammar over a fixed vocabulary of made-up words, as bytes.

The words are spelled from 64 symbols (letters, digits, ' and -), each symbol followed in any word
by one of only SUCCESSORS symbols: the unigram byte distribution is broad (3.7 nats for seed 0)
while the next byte is nearly certain within a word, and a word's category follows from the
grammar (sentence = noun phrase, verb phrase, optional prepositional phrase; Zipf-weighted word
choice). What is left uncertain is mostly which word starts next: for seed 0 the held-out entropy
of a byte given the previous 8 is about 0.1 of the unigram entropy, given the previous one 0.3. A
GPT of 2 layers, d_model 64, seq_len 128 (AdamW, lr 1e-3, batch 32) reaches a test loss of 0.37 of
the unigram entropy after 2 epochs of the default 200,000 tokens (about 2 s each on 2 cores).

Everything comes from one seed through Python's Mersenne Twister (random.Random.random only, whose
sequence Python guarantees across versions): the same seed gives the same bytes. The vocabulary
comes from its own stream and train and test from theirs, so the test text does not depend on
train_size.
"""

from __future__ import annotations

import bisect
import random
import string

ALPHABET = (string.ascii_lowercase + string.ascii_uppercase + string.digits + "'-").encode()
SUCCESSORS = 2  # symbols that may follow a symbol inside a word
WORD_LENGTHS = (4, 10)  # bytes, inclusive
WORDS = {"det": 4, "adj": 10, "noun": 16, "verb": 10, "adv": 6, "prep": 4}  # per category
PARAGRAPH = 0.2  # chance that a sentence ends its paragraph (a newline instead of a space)


def _stream(seed: int, stream: int) -> random.Random:
    """Independent streams per seed (vocabulary, train, test), as dpstudy.data.synthetic's."""
    return random.Random(seed * 3 + stream)


def _below(rng: random.Random, n: int) -> int:
    return min(int(rng.random() * n), n - 1)


class Language:
    """The vocabulary of one seed and the grammar that strings its words into sentences."""

    def __init__(self, seed: int):
        rng = _stream(seed, 0)
        successors = {a: [ALPHABET[_below(rng, len(ALPHABET))] for _ in range(SUCCESSORS)] for a in ALPHABET}
        seen: set[bytes] = set()
        self.words: dict[str, list[bytes]] = {}
        for category, count in WORDS.items():
            words = []
            while len(words) < count:
                low, high = WORD_LENGTHS
                length = low + _below(rng, high - low + 1)
                word = [ALPHABET[_below(rng, len(ALPHABET))]]
                while len(word) < length:
                    word.append(successors[word[-1]][_below(rng, SUCCESSORS)])
                if bytes(word) not in seen:
                    seen.add(bytes(word))
                    words.append(bytes(word))
            self.words[category] = words
        # Zipf: the k-th word of a category is chosen with weight 1 / (k + 1)
        self.cumulative = {c: _cumulative([1 / (k + 1) for k in range(len(w))]) for c, w in self.words.items()}

    def word(self, rng: random.Random, category: str) -> bytes:
        cumulative = self.cumulative[category]
        return self.words[category][bisect.bisect_right(cumulative, rng.random() * cumulative[-1])]

    def noun_phrase(self, rng: random.Random) -> list[bytes]:
        adjective = [self.word(rng, "adj")] if rng.random() < 0.5 else []
        return [self.word(rng, "det"), *adjective, self.word(rng, "noun")]

    def sentence(self, rng: random.Random) -> bytes:
        words = self.noun_phrase(rng) + [self.word(rng, "verb")]
        words += self.noun_phrase(rng) if rng.random() < 0.6 else [self.word(rng, "adv")]
        if rng.random() < 0.4:
            words += [self.word(rng, "prep"), *self.noun_phrase(rng)]
        return b" ".join(words) + b"." + (b"\n" if rng.random() < PARAGRAPH else b" ")

    def text(self, rng: random.Random, n: int) -> bytes:
        """Exactly n bytes of sentences (the last one cut)."""
        parts, length = [], 0
        while length < n:
            parts.append(self.sentence(rng))
            length += len(parts[-1])
        return b"".join(parts)[:n]


def _cumulative(weights: list[float]) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return out


def splits(seed: int, train_size: int, test_size: int) -> dict[str, bytes]:
    """{"train": bytes, "test": bytes} of train_size and test_size bytes for one seed."""
    language = Language(seed)
    return {
        "train": language.text(_stream(seed, 1), train_size),
        "test": language.text(_stream(seed, 2), test_size),
    }
