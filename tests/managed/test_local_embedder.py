"""``local-embedder`` (dagster_batchllm.managed.classical.embedder) on the example transcripts."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dagster_batchllm.managed.classical import EMBEDDING_MODELS, ClassicalResponder, RequestRefused
from dagster_batchllm.managed.classical.embedder import DEFAULT_DIMENSIONS, cosine, embed
from dagster_batchllm.managed.classical.errors import UnknownModelError

DATA_DIR = Path(__file__).resolve().parents[2] / "assets" / "data"
# Floors under the measured figures (printed by the tests), with room for a different box:
# topics: nearest-neighbour agreement 0.92 (chance 0.34), worst intra-inter margin 0.034;
# opener kinds: 0.57 (chance 0.03), worst margin 0.043.
MIN_TOPIC_NN = 0.85
MIN_KIND_NN = 0.45
MIN_MARGIN = 0.02


@pytest.fixture(scope="module")
def calls(generator):
    data = generator.load()
    return data[data.transcript_raw_text.notna() & (data.transcript_raw_text.str.strip() != "")]


@pytest.fixture(scope="module")
def similarities(calls):
    vectors = embed(calls.transcript_raw_text.tolist())
    return vectors @ vectors.T


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", re.sub(r"\{\w+\}", " ", text.lower()).replace("'", "")))


def _opener_kinds(generator, texts: list[str]) -> np.ndarray:
    """Which of the generator's opening lines (its kinds: "what time does your store close",
    "order status", "refund for a defect", ...) each call uses: the template whose fixed words
    the call covers best (typos and fillers make exact matching fail)."""
    templates = [(f"{topic}:{i}", _words(item[0] if isinstance(item, tuple) else item))
                 for topic, items in generator.OPENERS.items() for i, item in enumerate(items)]
    templates.append(("inquiry:refund-policy", _words(generator.REFUND_POLICY_QUESTION[0])))
    kinds = []
    for text in texts:
        words = _words(text)
        coverage = {kind: len(fixed & words) / len(fixed) for kind, fixed in templates}
        best = max(coverage, key=coverage.get)
        assert coverage[best] >= 0.7, (best, text[:200])
        kinds.append(best)
    return np.array(kinds)


def _separation(kinds: np.ndarray, sims: np.ndarray) -> tuple[float, float, dict]:
    """(nearest-neighbour kind agreement, chance agreement, kind -> (intra, inter) mean)."""
    off_diagonal = sims.copy()
    np.fill_diagonal(off_diagonal, -np.inf)
    agreement = float((kinds[off_diagonal.argmax(axis=1)] == kinds).mean())
    chance = float(sum((kinds == k).mean() ** 2 for k in set(kinds)))
    means = {}
    for kind in sorted(set(kinds)):
        member = kinds == kind
        if member.sum() < 2:
            continue
        block = sims[np.ix_(member, member)]
        intra = (block.sum() - np.trace(block)) / (member.sum() * (member.sum() - 1))
        means[kind] = (float(intra), float(sims[np.ix_(member, ~member)].mean()))
    return agreement, chance, means


def test_calls_of_a_topic_are_nearer_each_other(calls, similarities):
    topics = calls.expected_action_required.to_numpy()
    agreement, chance, means = _separation(topics, similarities)
    print(f"\ntopics: nearest-neighbour agreement {agreement:.3f} (chance {chance:.3f}); "
          + ", ".join(f"{k}: {a:.3f} vs {b:.3f}" for k, (a, b) in means.items()))
    assert agreement >= MIN_TOPIC_NN and agreement > 2 * chance
    for kind, (intra, inter) in means.items():
        assert intra > inter + MIN_MARGIN, kind


def test_calls_of_an_opening_kind_are_nearer_each_other(generator, calls, similarities):
    kinds = _opener_kinds(generator, calls.transcript_raw_text.tolist())
    agreement, chance, means = _separation(kinds, similarities)
    worst = min(intra - inter for intra, inter in means.values())
    print(f"\n{len(means)} opening kinds: nearest-neighbour agreement {agreement:.3f} "
          f"(chance {chance:.3f}); worst intra-inter margin {worst:.3f}")
    assert len(means) >= 30
    assert agreement >= MIN_KIND_NN and agreement > 10 * chance
    for kind, (intra, inter) in means.items():
        assert intra > inter + MIN_MARGIN, kind


@pytest.mark.slow
def test_vectors_are_unit_float32_and_deterministic(calls):
    texts = calls.transcript_raw_text.tolist()[:50]
    vectors = embed(texts)
    assert vectors.shape == (50, DEFAULT_DIMENSIONS) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A text's vector does not depend on its batch, its neighbours or the chunking.
    alone = np.stack([embed([t])[0] for t in texts[:5]])
    assert np.array_equal(alone, vectors[:5])
    many = embed(texts * 90)  # 4,500 rows: more than one vectorised chunk
    assert np.array_equal(many[-50:], vectors)


def test_the_same_in_another_process():
    """Hashing is BLAKE2b, not Python's per-process salted hash()."""
    code = ("from dagster_batchllm.managed.classical.embedder import embed; "
            "import sys; sys.stdout.write(embed(['refund my blender order'])[0].tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    assert bytes.fromhex(out) == embed(["refund my blender order"])[0].tobytes()


def test_lexical_neighbours_typos_and_empty_text():
    refund, typo, other = "I want a refund", "i want a refnud", "what time do you open"
    assert cosine(refund, typo) > 0.5 > cosine(refund, other)
    assert cosine("Don't cancel", "dont cancel") == pytest.approx(1.0, abs=1e-6)
    empty = embed(["", "   ", "?!", None])
    assert not empty.any()  # no word: the zero vector, not NaN
    assert cosine("", "anything") == 0.0
    assert embed([]).shape == (0, DEFAULT_DIMENSIONS)


def test_dimensions_and_bad_input():
    assert embed(["a b c"], dimensions=64).shape == (1, 64)
    for bad in (0, -3, 10**6, 2.5, True):
        with pytest.raises(ValueError, match="dimensions"):
            embed(["x"], dimensions=bad)
    with pytest.raises(ValueError, match="list of texts"):
        embed("one string")
    with pytest.raises(ValueError, match="must be a string"):
        embed(["ok", 3])


def test_the_responder_exposes_it_for_an_embeddings_route():
    responder = ClassicalResponder()
    assert responder.embedding_models() == list(EMBEDDING_MODELS) == ["local-embedder"]
    vectors = responder.embed("local-embedder", ["refund please", "store hours"], 128)
    assert vectors.shape == (2, 128) and vectors.dtype == np.float32
    assert responder.embed("local-embedder", ["x"]).shape == (1, DEFAULT_DIMENSIONS)
    with pytest.raises(UnknownModelError):
        responder.embed("local-summarizer", ["x"])
    with pytest.raises(RequestRefused) as raised:
        responder.embed("local-embedder", ["x"], 0)
    assert raised.value.status_code == 400


@pytest.mark.slow
def test_throughput_on_short_texts(calls):
    lines = [re.sub(r"^\w+:\s*", "", line) for text in calls.transcript_raw_text
             for line in text.split("\n") if 3 <= len(line.split()) <= 30]
    texts = [f"{lines[i % len(lines)]} #{i}" for i in range(20_000)]
    embed(texts[:2000])  # the word cache warm, as in a long-running server
    start = time.perf_counter()
    vectors = embed(texts)
    rate = len(texts) / (time.perf_counter() - start)
    print(f"\n{rate:,.0f} rows/s on ~10-word texts")
    assert vectors.shape == (20_000, DEFAULT_DIMENSIONS)
    assert rate > 5_000  # ~40,000 on a 2-core box; loose so a loaded CI box does not flake
