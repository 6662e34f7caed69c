"""Embedding engines. The deployment needs three things of one: its vector size, a token count
per input, and unit-length vectors for a batch of texts."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class EmbeddingEngine(Protocol):
    dimensions: int
    max_seq_length: int

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...


class SentenceTransformersEngine:
    """sentence-transformers on CPU or GPU, from a local model folder."""

    def __init__(self, path: str, device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device=device or "cpu", local_files_only=True)
        self.tokenizer = self.model.tokenizer
        self.dimensions = int(self.model.get_sentence_embedding_dimension())
        self.max_seq_length = int(self.model.max_seq_length)

    def count_tokens(self, texts: list[str]) -> list[int]:
        encoded = self.tokenizer(texts, add_special_tokens=True, truncation=False,
                                 return_attention_mask=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


ENGINES = {"sentence-transformers": SentenceTransformersEngine}
