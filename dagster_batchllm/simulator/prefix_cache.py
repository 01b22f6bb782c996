"""A simulated endpoint's prefix cache, as vLLM's automatic prefix caching keeps one.

vLLM splits a prompt into blocks of 16 tokens and names each full block by a hash chained to
the block before it, so a block's name stands for the whole prefix up to its end. Computed
blocks stay in GPU memory, least recently used evicted first, and a new request skips the
prefill of its longest run of leading blocks already there; the reply's
``usage.prompt_tokens_details.cached_tokens`` says how many tokens that was (OpenAI reports
the same field).

The server counts a token per 4 characters (``openai_server.protocol.tokens``), so a block
here is 64 characters of the prompt laid out as a chat template would: each message's role,
then its text (and its images' hashes), in order. A prompt's last character is never in a cached
block: vLLM always computes at least the last token, to have logits to sample from.

Lookups happen when a request arrives (as if its prefill ran at once), and every full block
of the prompt is added then, its unique tail included, as vLLM keeps every computed block.
"""

from __future__ import annotations

from collections import OrderedDict

BLOCK_TOKENS = 16  # vLLM's default block size
CHARS_PER_TOKEN = 4  # as openai_server.protocol.tokens counts
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


def prompt_stream(messages: list[tuple[str, str]]) -> str:
    """The text whose blocks are cached: (role, text) pairs as a chat template lays them out."""
    return "".join(f"<|{role}|>{text}" for role, text in messages)


class PrefixCache:
    """An LRU of chained block hashes, holding at most ``capacity_tokens`` tokens' worth.

    ``capacity_tokens`` 0 turns it off: nothing is cached and nothing is counted. Counters:
    ``requests`` looked up, their ``prompt_tokens`` (as the reply's usage counts them) and
    ``cached_tokens`` found; ``reset_stats`` zeroes them and keeps the blocks.
    """

    def __init__(self, capacity_tokens: int = 0):
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity_blocks = 0
        self.resize(capacity_tokens)
        self.reset_stats()

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def resize(self, capacity_tokens: int | None) -> None:
        self.capacity_blocks = max(0, int(capacity_tokens or 0)) // BLOCK_TOKENS
        self._evict()

    def clear(self) -> None:
        """Forget every block (a server that died lost its GPU memory)."""
        self._blocks.clear()

    def reset_stats(self) -> None:
        self.requests = self.prompt_tokens = self.cached_tokens = 0

    def serve(self, stream: str, prompt_tokens: int) -> int:
        """The tokens of ``stream``'s longest cached prefix of whole blocks; then every full
        block of it is cached, most recently used."""
        if not self.capacity_blocks:
            return 0
        blocks, digests, matched, digest = self._blocks, [], 0, 0
        # Full blocks, less the one holding the last character (see the module's docstring).
        for start in range(0, (len(stream) - 1) // BLOCK_CHARS * BLOCK_CHARS, BLOCK_CHARS):
            # A tuple hash chains the blocks; 64 bits, so collisions do not happen in practice.
            digest = hash((digest, stream[start:start + BLOCK_CHARS]))
            if matched == len(digests) and digest in blocks:
                matched += 1
            digests.append(digest)
        # Touched tail first, so a chain's head is the most recently used and evicted last (vLLM
        # frees a finished request's blocks in reverse order for the same reason): a shared
        # head outlives the unique tails that follow it.
        for digest in reversed(digests):
            blocks[digest] = None
            blocks.move_to_end(digest)
        self._evict()
        cached = min(matched * BLOCK_TOKENS, max(prompt_tokens - 1, 0))
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        return cached

    def _evict(self) -> None:
        blocks = self._blocks
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def stats(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "blocks": len(self._blocks),
                "capacity_tokens": self.capacity_blocks * BLOCK_TOKENS}

    def export(self) -> dict:
        """The counters, which survive a restart; the blocks do not (see ``clear``)."""
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens}

    def load(self, data: dict) -> None:
        self.requests = data.get("requests", 0)
        self.prompt_tokens = data.get("prompt_tokens", 0)
        self.cached_tokens = data.get("cached_tokens", 0)
