"""Seeded text lines and the one vocabulary tokenizer every framework's text pipeline uses.

The vocabulary is ``VOCABULARY_SIZE`` pronounceable words built from syllables (no word list to ship); a line
is 8–64 words drawn with a Zipf-like frequency (a few words common, most rare, as in text). The tokenizer maps
a line to ids: lower-case, split on whitespace, each word's id in the vocabulary, ``UNKNOWN`` for the others,
then truncated or padded with ``PAD`` to the sequence length.
"""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np

from fwbench.datasets.manifest import Manifest, write_manifest

LINES = "lines.txt"
VOCABULARY_SIZE = 4096
PAD, UNKNOWN = 0, 1  # ids of the two special tokens; words start at 2
_ONSETS = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "s", "l")
WORDS_PER_LINE = (8, 64)  # inclusive bounds


@cache
def vocabulary() -> tuple[str, ...]:
    """The VOCABULARY_SIZE words, shortest first, in a fixed order (ids 2 … VOCABULARY_SIZE + 1): syllables,
    then pairs of syllables, each word once ("a" + "na" and "an" + "a" are one word)."""
    syllables = ["".join(parts) for parts in itertools.product(_ONSETS, _VOWELS, _CODAS)]
    words: dict[str, None] = {}
    for length in itertools.count(1):
        for parts in itertools.product(syllables, repeat=length):
            words.setdefault("".join(parts))
            if len(words) == VOCABULARY_SIZE:
                return tuple(words)
    raise AssertionError("unreachable: itertools.count never ends")


@cache
def _ids() -> dict[str, int]:
    return {word: index + 2 for index, word in enumerate(vocabulary())}


def tokenize(line: str, seq_len: int) -> list[int]:
    """``line`` as ``seq_len`` token ids (UNKNOWN for words outside the vocabulary, PAD after the last word)."""
    ids = _ids()
    tokens = [ids.get(word, UNKNOWN) for word in line.lower().split()][:seq_len]
    return tokens + [PAD] * (seq_len - len(tokens))


def dataset_name() -> str:
    """The name a text data cell stores as its model."""
    return "text"


def make_text(out: Path, n: int, seed: int = 0) -> Manifest:
    """Write ``n`` seeded lines into ``out/lines.txt`` and the manifest. Returns the manifest."""
    if n < 1:
        raise ValueError(f"need n ≥ 1 (got n={n})")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = vocabulary()
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    frequency = (1.0 / ranks) / np.sum(1.0 / ranks)  # Zipf, exponent 1
    low, high = WORDS_PER_LINE
    with (out / LINES).open("w") as stream:
        for _ in range(n):
            chosen = rng.choice(len(words), size=int(rng.integers(low, high + 1)), p=frequency)
            stream.write(" ".join(words[i] for i in chosen) + "\n")
    return write_manifest(out, "text", dataset_name(), {"n": n, "seed": seed, "vocabulary": VOCABULARY_SIZE})
