"""The Files API, Files/Batches faults, big inputs and restarts on the simulated endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from dagster_batchllm.simulator import data_uri, png_bytes
from dagster_batchllm.testing import SimulatedEndpoint, openai_client, wait_for_batch

MODEL = "sim-model"
CHAT = "/v1/chat/completions"
REPO = Path(__file__).resolve().parents[2]


client_for = openai_client


def chat_line(i: int) -> str:
    return json.dumps({"custom_id": f"row-{i}", "method": "POST", "url": CHAT,
                       "body": {"model": MODEL,
                                "messages": [{"role": "user", "content": f"question {i}"}]}})


def jsonl(count: int) -> bytes:
    return "".join(chat_line(i) + "\n" for i in range(count)).encode()


def create_batch(client: openai.OpenAI, file_id: str):
    return client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")


def wait_for(client: openai.OpenAI, batch_id: str, timeout: float = 60.0):
    return wait_for_batch(client, batch_id, timeout=timeout)


def test_files_api_round_trip():
    with SimulatedEndpoint() as sim:
        client = client_for(sim)
        data = jsonl(3)
        uploaded = client.files.create(file=("rows.jsonl", data), purpose="batch")
        assert (uploaded.bytes, uploaded.filename, uploaded.purpose, uploaded.status) == (
            len(data), "rows.jsonl", "batch", "processed")
        assert client.files.retrieve(uploaded.id) == uploaded
        assert client.files.content(uploaded.id).read() == data
        other = client.files.create(file=("notes.txt", b"hello"), purpose="user_data")
        assert [f.id for f in client.files.list()] == [other.id, uploaded.id]
        assert [f.id for f in client.files.list(purpose="batch")] == [uploaded.id]
        with pytest.raises(openai.BadRequestError):  # a batch needs a purpose="batch" file
            create_batch(client, other.id)
        with pytest.raises(openai.BadRequestError):
            create_batch(client, "file-missing")
        with pytest.raises(openai.BadRequestError):
            client.files.create(file=("x.jsonl", data), purpose="nonsense")  # type: ignore[arg-type]
        deleted = client.files.delete(other.id)
        assert deleted.deleted and deleted.id == other.id
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(other.id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(other.id)
        on_disk = sorted(p.name for p in Path(sim._state.store.directory).iterdir())
        assert on_disk == [f"{uploaded.id}.jsonl"]  # the files live on disk, nothing else
        stats = sim.stats()["batches"]
        assert (stats["files_uploaded"], stats["bytes_uploaded"], stats["files_deleted"]) == (
            2, len(data) + 5, 1)
        assert stats["api_by_status"]["400"] == 3 and stats["api_by_status"]["404"] == 2


def test_input_of_a_running_batch_cannot_be_deleted():
    with SimulatedEndpoint(batch_stage_s=None) as sim:
        client = client_for(sim)
        uploaded = client.files.create(file=("rows.jsonl", jsonl(2)), purpose="batch")
        batch = create_batch(client, uploaded.id)
        with pytest.raises(openai.ConflictError):
            client.files.delete(uploaded.id)
        sim.complete_batches()
        assert client.batches.retrieve(batch.id).status == "completed"
        assert client.files.delete(uploaded.id).deleted
        output = client.batches.retrieve(batch.id).output_file_id
        assert client.files.retrieve(output).purpose == "batch_output"


def test_auth_and_scripted_api_faults():
    with SimulatedEndpoint(api_key="k", batch_stage_s=None) as sim:
        with pytest.raises(openai.AuthenticationError):
            client_for(sim, api_key="wrong").files.list()
        client = client_for(sim, api_key="k")
        sim.script_batch_api(500)
        with pytest.raises(openai.InternalServerError):
            client.files.create(file=("rows.jsonl", jsonl(2)), purpose="batch")
        assert sim.files() == []  # a refused upload leaves nothing behind
        uploaded = client.files.create(file=("rows.jsonl", jsonl(2)), purpose="batch")
        sim.script_batch_api("drop")
        with pytest.raises(openai.APIConnectionError):
            create_batch(client, uploaded.id)
        # The create took effect before the connection dropped: the client must find it
        # (here: by listing) instead of creating a second batch.
        (lost,) = sim.batches()
        assert lost["input_file_id"] == uploaded.id and lost["status"] == "validating"
        assert [b.id for b in client.batches.list()] == [lost["id"]]
        stats = sim.stats()["batches"]
        assert stats["batches_created"] == 1 and stats["api_script_pending"] == 0
        assert stats["api_by_status"] == {"401": 1, "500": 1, "200": 3}
        with pytest.raises(ValueError):
            sim.script_batch_api("stall")  # only statuses, "ok" and "drop" make sense here


@pytest.mark.slow
def test_a_120000_line_file_streams_through(tmp_path):
    count = 120_000
    source = tmp_path / "big.jsonl"
    with open(source, "wb") as out:
        for start in range(0, count, 10_000):
            out.write("".join(chat_line(i) + "\n"
                              for i in range(start, start + 10_000)).encode())
    with SimulatedEndpoint() as sim:
        client = client_for(sim, timeout=60)
        with open(source, "rb") as handle:
            uploaded = client.files.create(file=handle, purpose="batch")
        assert uploaded.bytes == source.stat().st_size
        batch = wait_for(client, create_batch(client, uploaded.id).id)
        assert batch.request_counts.model_dump() == {"total": count, "completed": count,
                                                     "failed": 0}
        seen = 0
        with client.files.with_streaming_response.content(batch.output_file_id) as response:
            for seen, line in enumerate(response.iter_lines(), start=1):
                if seen in (1, count):
                    result = json.loads(line)
                    assert result["custom_id"] == f"row-{seen - 1}"
                    content = result["response"]["body"]["choices"][0]["message"]["content"]
                    assert content == f"[sim] question {seen - 1}"
        assert seen == count
        stats = sim.stats(log=False)["batches"]
        assert stats["lines_answered"] == count and stats["line_duplicates"] == 0
        # Nothing of the file sits in the state: only the duplicate keys, 24 hex digits a line.
        state_size = len(json.dumps(sim._state.export()))
        assert state_size < uploaded.bytes / 4


def test_restart_mid_batch_answers_nothing_twice():
    sim = SimulatedEndpoint(batch_stage_s=None).start()
    try:
        client = client_for(sim)
        uploaded = client.files.create(file=("rows.jsonl", jsonl(10)), purpose="batch")
        batch = create_batch(client, uploaded.id)
        sim.advance_batches()
        sim.advance_batches(lines=4)
        sim.restart()
        sim.complete_batches()
        batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 10
        lines = client.files.content(batch.output_file_id).text.splitlines()
        assert [json.loads(line)["custom_id"] for line in lines] == [f"row-{i}"
                                                                     for i in range(10)]
        stats = sim.stats()["batches"]
        assert stats["lines_answered"] == 10 and stats["line_duplicates"] == 0
    finally:
        sim.stop()


@pytest.mark.slow
def test_process_mode_batches_survive_restart():
    sim = SimulatedEndpoint(process=True, batch_stage_s=None, api_key="k")
    with sim:
        sim.configure(batch_line_error_rate=1.0, batch_line_error_status=503)
        client = client_for(sim, api_key="k")
        uploaded = client.files.create(file=("rows.jsonl", jsonl(6)), purpose="batch")
        batch = create_batch(client, uploaded.id)
        sim.advance_batches()
        sim.advance_batches(lines=2)
        sim.script_batch_lines(200, 200, 200, 200)  # the rest succeed, after the restart
        sim.restart()
        (listed,) = sim.batches()
        assert listed["status"] == "in_progress" and listed["lines_read"] == 2
        sim.complete_batches()
        batch = client.batches.retrieve(batch.id)
        assert batch.request_counts.model_dump() == {"total": 6, "completed": 4, "failed": 2}
        errors = client.files.content(batch.error_file_id).text.splitlines()
        assert [json.loads(line)["response"]["status_code"] for line in errors] == [503, 503]
        directory = sim._state.store.directory
        assert os.path.isdir(directory) and sim.stats()["batches"]["lines_answered"] == 6
    assert sim._proc is None


@pytest.mark.slow
def test_command_line_flags_for_the_new_apis(tmp_path):
    files_dir = tmp_path / "files"
    cmd = [sys.executable, "-m", "dagster_batchllm.simulator", "--port", "0",
           "--embedding-models", "cli-embed", "--embedding-dimensions", "12",
           "--no-embedding-base64", "--max-image-bytes", "10", "--batch-stage-s", "-1",
           "--files-dir", str(files_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        base_url = proc.stdout.readline().decode().strip()
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        reply = client.embeddings.create(model="cli-embed", input="x", encoding_format="float")
        assert len(reply.data[0].embedding) == 12
        with pytest.raises(openai.BadRequestError):  # --no-embedding-base64
            client.embeddings.create(model="cli-embed", input="x")
        with pytest.raises(openai.BadRequestError) as info:  # --max-image-bytes
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_uri(png_bytes())}}]}])
        assert info.value.code == "image_too_large"
        uploaded = client.files.create(file=("rows.jsonl", jsonl(2)), purpose="batch")
        assert (files_dir / f"{uploaded.id}.jsonl").read_bytes() == jsonl(2)
        batch = create_batch(client, uploaded.id)
        time.sleep(0.2)  # --batch-stage-s -1: held until advanced
        assert client.batches.retrieve(batch.id).status == "validating"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
