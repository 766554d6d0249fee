"""``prefix``: requests that begin alike go to the same replica, where vLLM's prefix cache already holds
their first tokens' keys and values, unless that replica is overloaded.

The key is a hash of the prompt's first ``PREFIX_BLOCKS`` full blocks of ``BLOCK_TOKENS`` tokens (the
prompt as the engine tokenizes it: a chat rendered with the model's template, serving/worker/llm/tokens.py):
the turns of one conversation, or requests sharing a long system prompt, share it. The replica is the
key's bounded-load choice (hashing.py): its rendezvous choice while that one carries at most 1.25 times
the average load, else the next within bounds. A prompt shorter than one block goes to the least loaded.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from serving.worker.llm.routing.base import Replica, RouteHint, Rotation, by_load
from serving.worker.llm.routing.hashing import bounded

BLOCK_TOKENS = 16    # vLLM's default KV cache block: its prefix cache matches whole blocks
PREFIX_BLOCKS = 8    # 128 tokens: a system prompt or a conversation's first turn, not the user's last words


class Prefix:
    def __init__(self) -> None:
        self.rotation = Rotation()

    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]:
        key = hint.prefix() if len(replicas) > 1 else None
        if not key:
            return by_load(replicas, self.rotation)
        return bounded(replicas, key)


def prefix_key(token_ids: Sequence[int]) -> bytes | None:
    """The key of a prompt's leading full blocks (at most :data:`PREFIX_BLOCKS`); None under one block."""
    blocks = min(len(token_ids) // BLOCK_TOKENS, PREFIX_BLOCKS)
    if not blocks:
        return None
    ids = b"".join(int(t).to_bytes(4, "little", signed=False) for t in token_ids[:blocks * BLOCK_TOKENS])
    return hashlib.blake2b(ids, digest_size=16).digest()
