"""Image inputs through infer(): which image reaches which row, the ledger, budgets, bad files.

The simulated endpoint answers an image part with ``[image sha256:<12 hex>]`` (the hash of the
bytes it decoded), so a reply proves which image reached which row.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from types import SimpleNamespace

import pandas as pd
import pytest

from dagster_batchllm import InferenceConfigError
from dagster_batchllm.core.errors import RowError
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.images import image_tokens
from dagster_batchllm.core.tasks.chat.rendering import iter_row_requests
from dagster_batchllm.testing import png_bytes

MODEL = "sim-model"


def marker(raw: bytes) -> str:
    return f"[image sha256:{hashlib.sha256(raw).hexdigest()[:12]}]"


def jpeg_bytes(width: int = 8, height: int = 8) -> bytes:
    """A baseline grayscale JPEG of flat 8x8 blocks, written marker by marker."""
    def segment(marker_byte: int, payload: bytes) -> bytes:
        return bytes([0xFF, marker_byte]) + struct.pack(">H", len(payload) + 2) + payload

    blocks = -(-width // 8) * -(-height // 8)
    bits = "00" * blocks  # per block: DC difference 0 (code 0), then end-of-block (code 0)
    bits += "1" * (-len(bits) % 8)
    data = int(bits, 2).to_bytes(len(bits) // 8, "big")
    one_code = bytes([1] + [0] * 15)  # one Huffman code of length 1
    return (b"\xff\xd8" + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
            + segment(0xDB, b"\x00" + b"\x01" * 64)
            + segment(0xC0, b"\x08" + struct.pack(">HH", height, width) + b"\x01\x01\x11\x00")
            + segment(0xC4, b"\x00" + one_code + b"\x00")
            + segment(0xC4, b"\x10" + one_code + b"\x00")
            + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + data + b"\xff\xd9")


def webp_bytes(width: int, height: int) -> bytes:
    """A lossless WebP header (VP8L) of the given size; the simulator and the sniffing only
    read the container and the size."""
    bits = (width - 1) | ((height - 1) << 14)
    payload = b"\x2f" + bits.to_bytes(4, "little") + b"\x00" * 8
    chunk = b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def gif_bytes(width: int = 3, height: int = 2) -> bytes:
    return (b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00"
            + b"\x2c\x00\x00\x00\x00" + struct.pack("<HH", width, height) + b"\x00"
            + b"\x02\x02\x44\x01\x00" + b";")


def infer(client, df, **kwargs):
    kwargs.setdefault("prompt", "Read {name}")
    return client.infer(df, model=MODEL, output_column="out", **kwargs)


def requests(call: InferenceCall, df: pd.DataFrame) -> list:
    rows = df[call.input_columns()].itertuples(index=False, name=None)
    return list(iter_row_requests(rows, call, default_max_tokens=32))


def test_each_row_gets_its_own_image_from_bytes_paths_and_data_uris(sim, make_client, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)  # path cells are read under the working directory (files_roots)
    images = [png_bytes(2, 2, (i * 40, 0, 0)) for i in range(4)]
    path = tmp_path / "third.png"
    path.write_bytes(images[2])
    cells = [images[0], bytearray(images[1]), str(path),
             "data:image/png;base64," + base64.b64encode(images[3]).decode()]
    df = pd.DataFrame({"name": list("abcd"), "page": cells}, index=[10, 11, 12, 13])

    result = infer(make_client(sim), df, images="page")

    assert result.df["out_error"].isna().all(), result.df["out_error"].tolist()
    for index, name, raw in zip(df.index, "abcd", images, strict=True):
        assert result.df.loc[index, "out"] == f"[sim] Read {name} {marker(raw)}"
    stats = sim.stats(log=False)["images"]
    assert (stats["requests"], stats["images"], stats["bytes"]) == (
        4, 4, sum(len(raw) for raw in images))


def test_the_mime_type_is_sniffed_from_the_bytes_and_urls_pass_through(sim, make_client):
    cells = {"png": png_bytes(), "jpeg": jpeg_bytes(), "gif": gif_bytes(),
             "webp": webp_bytes(30, 20), "remote": "https://example.com/scan.png"}
    df = pd.DataFrame({"name": list(cells), "img": list(cells.values())})
    call = InferenceCall(prompt="Read {name}", model=MODEL, images="img")
    urls = [json.loads(r.body)["messages"][0]["content"][1]["image_url"]["url"]
            for r in requests(call, df)]
    assert [u.split(";")[0] for u in urls[:4]] == [
        "data:image/png", "data:image/jpeg", "data:image/gif", "data:image/webp"]
    assert urls[4] == "https://example.com/scan.png"

    result = infer(make_client(sim), df, images="img")

    assert result.df["out_error"].isna().all(), result.df["out_error"].tolist()
    assert result.df["out"].iloc[1].endswith(marker(cells["jpeg"]))
    assert result.df["out"].iloc[4].endswith(
        f"[remote image sha256:{hashlib.sha256(cells['remote'].encode()).hexdigest()[:12]}]")
    assert sim.stats(log=False)["images"]["remote"] == 1


def test_several_columns_and_list_cells_send_every_image_in_order(sim, make_client):
    first, second, third = (png_bytes(1, 1, (c, c, c)) for c in (1, 2, 3))
    df = pd.DataFrame({"name": ["x"], "pages": [[first, second]], "logo": [third]})

    result = infer(make_client(sim), df, images=["pages", "logo"])

    assert result.df["out"].iloc[0] == (
        f"[sim] Read x {marker(first)} {marker(second)} {marker(third)}")


def test_structured_output_per_row_and_reruns_send_nothing(sim, make_client):
    schema = {"type": "object", "properties": {"vendor": {"type": "string"}},
              "required": ["vendor"], "additionalProperties": False}
    df = pd.DataFrame({"name": ["a", "b"],
                       "page": [png_bytes(1, 1, (9, 0, 0)), png_bytes(1, 1, (0, 9, 0))]})
    client = make_client(sim)

    first = infer(client, df, images="page", response_format=schema)
    again = infer(client, df, images="page", response_format=schema)

    assert first.df["out_error"].isna().all()
    vendors = [row["vendor"] for row in first.df["out"]]
    assert all(isinstance(v, str) for v in vendors) and vendors[0] != vendors[1]
    assert again.df["out"].tolist() == first.df["out"].tolist()
    assert again.stats.requests == 0 and sim.stats(log=False)["images"]["requests"] == 2


def test_a_changed_image_changes_only_its_rows_key(sim, make_client):
    df = pd.DataFrame({"name": ["a", "b"], "page": [png_bytes(1, 1, (1, 0, 0)),
                                                    png_bytes(1, 1, (2, 0, 0))]})
    client = make_client(sim)
    infer(client, df, images="page")
    df.loc[1, "page"] = png_bytes(1, 1, (3, 0, 0))

    result = infer(client, df, images="page")

    assert result.stats.requests == 1
    assert result.df.loc[1, "out"].endswith(marker(png_bytes(1, 1, (3, 0, 0))))


def test_bad_images_fail_alone_with_their_reason_before_sending(sim, make_client, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)  # path cells are read under the working directory (files_roots)
    good = png_bytes(2, 2)
    (tmp_path / "folder").mkdir()
    cells = {
        "good": good,
        "truncated_png": good[:-12],
        "truncated_jpeg": jpeg_bytes()[:-2],
        "bmp": b"BM" + b"\x00" * 60,
        "text_file": str(tmp_path / "notes.txt"),
        "missing": str(tmp_path / "missing.png"),
        "directory": str(tmp_path / "folder"),
        "empty": b"",
        "null": None,
        "pd_na": pd.NA,
        "number": 7,
        "too_big": png_bytes(64, 64, (1, 2, 3)) + b"\x00" * 4000,
        "bad_base64": "data:image/png;base64,@@@",
    }
    (tmp_path / "notes.txt").write_text("not an image")
    df = pd.DataFrame({"name": list(cells), "img": pd.Series(
        list(cells.values()), dtype=object, index=list(cells))}, index=list(cells))

    result = infer(make_client(sim), df, images="img", max_image_bytes=4000)

    errors = result.df["out_error"]
    assert result.df.loc["good", "out"].endswith(marker(good)) and errors["good"] is None
    expected = {
        "truncated_png": "corrupt or truncated", "truncated_jpeg": "corrupt or truncated",
        "bmp": "unsupported image format", "text_file": "unsupported image format",
        "missing": "does not exist", "directory": "is a directory", "empty": "empty",
        "null": "is null", "pd_na": "is null", "number": "holds an int",
        "too_big": "over the limit of 4000 bytes",
        "bad_base64": "not valid base64",
    }
    for case, reason in expected.items():
        assert errors[case].startswith("invalid_input: ") and reason in errors[case], (
            case, errors[case])
    assert sim.stats(log=False)["images"]["requests"] == 1  # only the good row was sent


def test_image_tokens_follow_openais_rule():
    assert image_tokens(1024, 1024, "high") == 765  # OpenAI's worked example: 4 tiles
    assert image_tokens(2048, 4096, "high") == 1105  # 1024x2048, then 768x1536: 6 tiles
    assert image_tokens(4096, 8192, "low") == 85
    assert image_tokens(100, 100, "auto") == 255  # small: one tile


def test_reservations_and_estimates_count_image_tokens_not_base64(sim, make_client):
    big = png_bytes(1024, 1024)
    df = pd.DataFrame({"name": ["a"], "img": [big]})
    call = InferenceCall(prompt="Read {name}", model=MODEL, images="img", max_tokens=10)
    low = InferenceCall.of(call, image_detail="low")
    [high_request] = requests(call, df)
    [low_request] = requests(low, df)
    text = InferenceCall(prompt="Read {name}", model=MODEL, max_tokens=10)
    [text_request] = requests(text, df)
    assert high_request.reserve_tokens - text_request.reserve_tokens == 765
    assert low_request.reserve_tokens - text_request.reserve_tokens == 85
    assert json.loads(low_request.body)["messages"][0]["content"][1]["image_url"][
        "detail"] == "low"
    assert high_request.typical_prompt_tokens == text_request.typical_prompt_tokens + 765

    client = make_client(sim)
    assert client.estimate(df, call).estimated_prompt_tokens == (
        high_request.typical_prompt_tokens)
    deferred = client.infer(df, call, output_column="out",
                            token_budget=high_request.reserve_tokens - 1)
    assert deferred.stats.deferred == 1 and sim.stats(log=False)["images"]["requests"] == 0
    sent = client.infer(df, call, output_column="out", token_budget=high_request.reserve_tokens)
    assert sent.stats.succeeded == 1
    # settled from the reply's usage (the simulator charges 85 per image)
    assert 85 < sent.stats.prompt_tokens < high_request.reserve_tokens


def test_the_call_checks_its_image_fields():
    with pytest.raises(InferenceConfigError, match="messages_column"):
        InferenceCall(messages_column="m", images="img")
    with pytest.raises(InferenceConfigError, match="image_detail"):
        InferenceCall(prompt="x", images="img", image_detail="medium")
    with pytest.raises(InferenceConfigError, match="max_image_bytes"):
        InferenceCall(prompt="x", images="img", max_image_bytes=0)
    with pytest.raises(InferenceConfigError, match="images must be"):
        InferenceCall(prompt="x", images=["img", 3])
    call = InferenceCall(prompt="Read {name}", images=("a", "b", "a"))
    assert call.images == ["a", "b"] and call.input_columns() == ["name", "a", "b"]
    with pytest.raises(InferenceConfigError, match=r"\['b'\]"):
        call.bind(["name", "a"], SimpleNamespace(models=frozenset({MODEL}),
                                                model_when_unnamed=MODEL))


def test_images_take_a_column_as_the_prompt_writes_it(sim, make_client):
    """images="{page}" is images="page": the same column, request keys and answers."""
    df = pd.DataFrame({"name": ["a", "b"], "page": [png_bytes(), gif_bytes()]})
    braced = InferenceCall(prompt="Read {name}", model=MODEL, images=["{page}"])
    plain = InferenceCall(prompt="Read {name}", model=MODEL, images="page")
    assert braced.images == ["page"] and braced.code_version == plain.code_version
    assert [r.key for r in requests(braced, df)] == [r.key for r in requests(plain, df)]
    client = make_client(sim)
    first = infer(client, df, images="{page}")
    assert first.df["out_error"].isna().all() and first.stats.requests == 2
    assert infer(client, df, images="page").stats.cached == 2
    with pytest.raises(InferenceConfigError, match="not a template"):
        InferenceCall(prompt="x", images="{page} and {other}")


def test_images_go_with_a_model_column_each_row_to_its_own_model(make_client):
    from dagster_batchllm.testing import SimulatedEndpoint

    class SaysWhoSaw:
        def models(self) -> list[str]:
            return ["vision-a", "vision-b"]

        def respond(self, model: str, messages: list[dict], params: dict) -> str:
            return f"{model} saw {messages[-1]['content']}"

    images = [png_bytes(2, 2, (i * 60, 0, 0)) for i in range(3)]
    df = pd.DataFrame({"name": list("abc"), "page": images,
                       "model": ["vision-a", "vision-b", "no-such-model"]})
    with SimulatedEndpoint(responder=SaysWhoSaw(), models=("vision-a", "vision-b")) as two:
        result = make_client(two).infer(df, prompt="Read {name}", images="page",
                                        model_column="model", output_column="out")
    for answer, model, name, raw in zip(result.df["out"][:2], ["vision-a", "vision-b"], "ab",
                                        images, strict=False):
        assert answer.startswith(f"{model} saw Read {name}") and marker(raw) in answer
    assert result.error_types.tolist() == [None, None, "unsupported_model"]


def test_code_version_covers_images_and_text_calls_keep_theirs():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    text = InferenceCall(prompt="Summarize: {text}", model="m", max_tokens=64,
                         response_format=schema)
    assert text.code_version == "3a934cd02049"  # as before image inputs existed
    with_images = InferenceCall.of(text, images="page")
    assert len({text.code_version, with_images.code_version,
                InferenceCall.of(with_images, image_detail="low").code_version,
                InferenceCall.of(with_images, images="other").code_version}) == 4
    assert InferenceCall.of(with_images, max_image_bytes=10).code_version == (
        with_images.code_version)


def test_an_image_row_error_is_a_row_error_not_a_request():
    call = InferenceCall(prompt="Read {name}", model=MODEL, images="img")
    [error] = requests(call, pd.DataFrame({"name": ["a"], "img": [b"nope"]}))
    assert isinstance(error, RowError) and "unsupported image format" in str(error)
