"""``prefix``: requests that begin alike go to the same replica, where vLLM's prefix cache already holds
their first tokens' keys and values, unless that replica is overloaded.

The key is a hash of the prompt's first ``PREFIX_BLOCKS`` full blocks of ``BLOCK_TOKENS`` tokens (the
prompt as the engine tokenizes it: a chat rendered with the model's template, serving/llm/relay/tokens.py):
the turns of one conversation, or requests sharing a long system prompt, share it. The key's home is
where this worker placed it before; a new key is placed by its rendezvous choice, bounded by the live
keys each replica already homes (key_homes.py). The request goes to the key's home while that one,
after this request, carries at most 1.25 times the average load plus ``HEADROOM`` requests (hashing.py),
else to the next in the key's rendezvous order within that bound. A prompt shorter than one block goes
to the least loaded.

Why the headroom: sent to its key's replica, a request's prefill is its new tokens only; sent anywhere
else, it is the whole prompt, which for a long context is most of its time to first token. A few more
requests on the key's replica cost each request there little (the engine batches their decode steps),
so spilling while the replica is only a few requests above the average turned cache hits into full
prefills: on 2 replicas and 4 streams, ``ceil(1.25 x 4 / 2) = 3`` moved a conversation whenever its
replica held all three other requests (docs/llm-routing.md has the measured figures). Spilling still
bounds a hot prefix: at high load the ``1.25 x`` average term dominates.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from serving.llm.routing.policies.base import Replica, RouteHint, Rotation, by_load
from serving.llm.routing.policies.hashing import rendezvous, within
from serving.llm.routing.policies.key_homes import KeyHomes

BLOCK_TOKENS = 16    # vLLM's default KV cache block: its prefix cache matches whole blocks
PREFIX_BLOCKS = 8    # 128 tokens: a system prompt or a conversation's first turn, not the user's last words
HEADROOM = 4         # requests a key's replica may carry above the bound before a key spills


class Prefix:
    def __init__(self) -> None:
        self.rotation = Rotation()
        self.homes = KeyHomes()

    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]:
        key = hint.prefix() if len(replicas) > 1 else None
        if not key:
            return by_load(replicas, self.rotation)
        home = self.homes.home(key, replicas)
        return within([home, *(r for r in rendezvous(replicas, key) if r is not home)], headroom=HEADROOM)


def prefix_key(token_ids: Sequence[int]) -> bytes | None:
    """The key of a prompt's leading full blocks (at most :data:`PREFIX_BLOCKS`); None under one block."""
    blocks = min(len(token_ids) // BLOCK_TOKENS, PREFIX_BLOCKS)
    if not blocks:
        return None
    ids = b"".join(int(t).to_bytes(4, "little", signed=False) for t in token_ids[:blocks * BLOCK_TOKENS])
    return hashlib.blake2b(ids, digest_size=16).digest()
