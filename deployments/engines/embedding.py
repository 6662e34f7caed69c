"""Embedding engines. The deployment needs three things of one: its vector size, a token count
per input, and unit-length vectors for a batch of texts."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np


class Encoded(NamedTuple):
    vectors: np.ndarray  # (texts, dimensions), unit length
    tokens: list[int]  # each text's whole token count (the model read at most max_seq_length)


class EmbeddingEngine(Protocol):
    dimensions: int
    max_seq_length: int

    def embed(self, texts: list[str]) -> Encoded: ...

    def count_tokens(self, texts: list[str]) -> list[int]: ...


class SentenceTransformersEngine:
    """sentence-transformers on CPU or GPU, from a local model folder."""

    def __init__(self, path: str, options: dict | None = None) -> None:
        """`options` (the catalog's `engine_options`): `device` (cpu), `threads` (torch's
        intra-op threads; by default what the process was given, one for a Ray replica with
        a fraction of a CPU)."""
        import torch
        from sentence_transformers import SentenceTransformer

        options = options or {}
        if options.get("threads"):
            torch.set_num_threads(int(options["threads"]))
        device = options.get("device")

        self.model = SentenceTransformer(path, device=device or "cpu", local_files_only=True)
        self.tokenizer = self.model.tokenizer
        dimension = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        self.dimensions = int(dimension())
        self.max_seq_length = int(self.model.max_seq_length)

    def count_tokens(self, texts: list[str]) -> list[int]:
        if not texts:  # the tokenizer fails on an empty batch
            return []
        encoded = self.tokenizer(texts, add_special_tokens=True, truncation=False,
                                 return_attention_mask=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def embed(self, texts: list[str]) -> Encoded:
        """The model's forward pass on one padded batch. `encode` would do the same plus a
        device move of the whole model and a sort per call (5% of a replica's time).

        Token counts come from the batch's own attention mask; only a text that filled
        `max_seq_length` (so may have been cut) is tokenised again, whole."""
        import torch

        features = self.model.preprocess(texts)
        with torch.inference_mode():
            vectors = self.model(features)["sentence_embedding"]
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        tokens = features["attention_mask"].sum(dim=1).tolist()
        cut = [i for i, count in enumerate(tokens) if count >= self.max_seq_length]
        for i, count in zip(cut, self.count_tokens([texts[i] for i in cut]), strict=True):
            tokens[i] = count
        return Encoded(vectors.numpy().astype(np.float32, copy=False), tokens)


ENGINES: dict[str, type] = {"sentence-transformers": SentenceTransformersEngine}
