"""The routing policies' placement, as pure functions of replicas and requests: no engine needed here
(tests/serving/llm/test_replicas_e2e.py routes over real vLLM replicas). Hashes are deterministic,
so every figure below is exact for these keys; the bounds stated are what the method promises."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from serving.llm.routing import policies as routing
from serving.llm.routing.policies.base import Replica, RouteHint
from serving.llm.routing.policies.hashing import BALANCE, capacity, rendezvous
from serving.llm.routing.policies.prefix import BLOCK_TOKENS, HEADROOM, PREFIX_BLOCKS, prefix_key


def replicas(n: int) -> list[Replica]:
    return [Replica(id=str(i), url=f"http://127.0.0.1:{9000 + i}/v1") for i in range(n)]


def first(policy, reps, hint=None) -> Replica:
    order = policy.order(reps, hint or RouteHint())
    assert sorted(r.id for r in order) == sorted(r.id for r in reps), "every replica, once: the failover order"
    return order[0]


def test_policies_are_chosen_by_name_and_an_unknown_name_is_refused():
    assert routing.names() == ("least-loaded", "session", "prefix", "round-robin")
    assert type(routing.create(None)).__name__ == "LeastLoaded"
    with pytest.raises(ValueError, match="routing 'random' is not a policy; known: least-loaded, session"):
        routing.create("random")


def test_round_robin_takes_turns_whatever_the_load():
    reps = replicas(3)
    reps[0].in_flight = 50
    policy = routing.create("round-robin")
    assert [first(policy, reps).id for _ in range(6)] == ["0", "1", "2", "0", "1", "2"]


def test_least_loaded_picks_the_fewest_running_and_waiting_and_rotates_ties():
    reps = replicas(3)
    policy = routing.create("least-loaded")
    assert [first(policy, reps).id for _ in range(3)] == ["0", "1", "2"], "idle: ties rotate"
    reps[0].engine_queue, reps[0].in_flight_at_read = 7.0, 0   # other workers' requests, from its metrics
    reps[1].in_flight = 2                                       # this worker's own, since no read
    reps[2].engine_queue, reps[2].in_flight_at_read, reps[2].in_flight = 3.0, 3, 0  # all 3 of ours finished
    assert [r.load for r in reps] == [7.0, 2.0, 0.0]
    assert policy.order(reps, RouteHint())[:3] == [reps[2], reps[1], reps[0]]


def sessions(n: int) -> list[str]:
    return [f"user-{i}" for i in range(n)]


def placement(policy, reps, keys) -> dict[str, str]:
    return {k: first(policy, reps, RouteHint(session=k)).id for k in keys}


def test_session_keeps_a_conversation_on_one_replica_and_spreads_sessions():
    policy, reps, keys = routing.create("session"), replicas(4), sessions(10_000)
    before = placement(policy, reps, keys)
    assert placement(policy, reps, keys) == before, "the same key, the same replica, every time"
    assert placement(routing.create("session"), list(reversed(reps)), keys) == before, \
        "another worker (another policy object, replicas listed otherwise) agrees"
    counts = Counter(before.values())
    # 10,000 keys on 4 replicas: 2,500 each on average, sd sqrt(10000 * 1/4 * 3/4) = 43; 5 sd either side
    assert all(2_284 <= c <= 2_716 for c in counts.values()), counts


def test_a_replica_added_moves_about_one_session_in_n_and_only_to_itself():
    policy, keys = routing.create("session"), sessions(10_000)
    before = placement(policy, replicas(4), keys)
    after = placement(policy, replicas(5), keys)
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "4" for k in moved), "no session moves between the replicas already there"
    # expected 1/5 = 2,000 moved, sd sqrt(10000 * 0.2 * 0.8) = 40; 5 sd above
    assert len(moved) <= 10_000 / 5 + 5 * 40, len(moved)
    assert len(moved) >= 10_000 / 5 - 5 * 40, len(moved)


def test_a_replica_gone_moves_only_its_own_sessions():
    policy, keys, reps = routing.create("session"), sessions(5_000), replicas(4)
    before = placement(policy, reps, keys)
    after = placement(policy, [r for r in reps if r.id != "2"], keys)
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == "2"}


def test_session_without_a_key_goes_to_the_least_loaded():
    reps = replicas(2)
    reps[0].in_flight = 3
    assert first(routing.create("session"), reps).id == "1"


def prompt(conversation: int, turn: int) -> list[int]:
    """A conversation's prompt: its own 200-token context, then its turns so far."""
    rng = random.Random(conversation)
    context = [rng.randrange(512) for _ in range(200)]
    return context + [rng.randrange(512) for _ in range(20 * turn)]


def key_hint(ids: list[int]) -> RouteHint:
    return RouteHint(prefix=lambda: prefix_key(ids))


def test_prefix_key_is_the_leading_full_blocks():
    ids = list(range(PREFIX_BLOCKS * BLOCK_TOKENS + 40))
    assert prefix_key(ids[:BLOCK_TOKENS - 1]) is None, "under one block: no key"
    assert prefix_key(ids[:BLOCK_TOKENS]) == prefix_key(ids[:2 * BLOCK_TOKENS - 1]), "a partial block does not count"
    assert prefix_key(ids) == prefix_key(ids[:PREFIX_BLOCKS * BLOCK_TOKENS]) != prefix_key(ids[:BLOCK_TOKENS])
    assert prefix_key([*ids[:-1], 999]) == prefix_key(ids), "past the leading blocks nothing counts"


def test_prefix_keeps_a_conversations_turns_together_and_spreads_conversations():
    policy, reps = routing.create("prefix"), replicas(4)
    homes = {}
    for c in range(400):
        turns = {first(policy, reps, key_hint(prompt(c, t))).id for t in range(5)}
        assert len(turns) == 1, f"conversation {c}'s turns went to {turns}"
        homes[c] = turns.pop()
    counts = Counter(homes.values())
    # 400 conversations on 4 replicas: 100 each on average, sd sqrt(400 * 1/4 * 3/4) = 8.7; 5 sd either side
    assert all(56 <= n <= 144 for n in counts.values()), counts


def test_prefix_spills_a_hot_prefix_within_the_bounded_load():
    """Every request shares one prefix (one system prompt for all): its home takes requests while its load
    stays within ceil(1.25 * (total + 1) / N) + HEADROOM, and the next choice takes the rest; nothing is
    ever placed past capacity."""
    policy, reps = routing.create("prefix"), replicas(4)
    hot = key_hint(prompt(7, 0))
    home = first(policy, reps, hot)
    for _ in range(200):  # requests arrive and stay (nothing finishes): loads only grow
        cap = capacity(reps, BALANCE, HEADROOM)
        chosen = first(policy, reps, hot)
        assert chosen.load + 1 <= cap, (chosen.id, chosen.load, cap)
        chosen.in_flight += 1
    preference = [r.load for r in rendezvous(reps, prefix_key(prompt(7, 0)))]
    assert preference[0] == home.load == math.ceil(BALANCE * 200 / 4) + HEADROOM, preference
    assert preference == sorted(preference, reverse=True), f"the overflow fills the key's next choices in turn: {preference}"
    assert sum(preference) == 200


def test_prefix_keeps_a_conversation_home_while_its_replica_is_a_few_requests_busier():
    """The case the benchmark measured (docs/llm-routing.md): 2 replicas, 4 streams, and a conversation's
    replica holding the other three requests. The bound without headroom, ceil(1.25 * 4 / 2) = 3, sent the
    turn to the other replica, where its whole context was an uncached prefill; it stays home now. With
    the other replica idle, home keeps its keys while h + 1 <= ceil(1.25 * (h + 1) / 2) + 4, up to 12."""
    policy, reps = routing.create("prefix"), replicas(2)
    hint = key_hint(prompt(3, 4))
    home = rendezvous(reps, prefix_key(prompt(3, 4)))[0]
    home.in_flight = 3
    assert home.load + 1 > capacity(reps), "the paper's bound alone would move this turn"
    assert first(policy, reps, hint) is home
    stays = [h for h in range(40) if (setattr(home, "in_flight", h) or first(policy, reps, hint)) is home]
    assert stays == list(range(13)), stays


def test_prefix_of_a_short_prompt_goes_to_the_least_loaded():
    reps = replicas(2)
    reps[1].in_flight = 4
    assert first(routing.create("prefix"), reps, key_hint(list(range(BLOCK_TOKENS - 1)))).id == "0"


def test_bounded_load_holds_over_random_loads():
    """Mirrokni et al.'s bound (with the prefix policy's headroom), checked over 2,000 random states: the
    chosen replica never exceeds ceil(c * (total + 1) / N) + HEADROOM after taking the request, and it
    is the key's first choice whenever that one fits."""
    rng = random.Random(0)
    for trial in range(2_000):
        policy = routing.create("prefix")  # a new key in a fresh worker: its home is its rendezvous choice
        reps = replicas(rng.randint(2, 8))
        for r in reps:
            r.in_flight = rng.choice([0, 0, 1, 2, 5, 20])
        key = trial.to_bytes(4, "little")
        order = policy.order(reps, RouteHint(prefix=lambda key=key: key))
        cap = capacity(reps, headroom=HEADROOM)
        assert order[0].load + 1 <= cap
        favourite = rendezvous(reps, key)[0]
        if favourite.load + 1 <= cap:
            assert order[0] is favourite
