"""``ctxkit.core.hub`` through the real ``huggingface_hub`` download path, against a local
stand-in for the Hub (tests/hub_server.py) that ``HF_ENDPOINT`` points at: no network.

What ``huggingface_hub`` 2.4 does, and these tests pin down:

* a connection dropped mid-file is retried within the same call (after 1 s) with
  ``Range: bytes=<n>-``, ``n`` the bytes it had handed over in whole chunks of
  ``constants.DOWNLOAD_CHUNK_SIZE`` (10 MiB; set to 4 KiB here, so the tiny files behave as
  large ones would);
* a call that fails keeps the files already complete, but not the partial one (each
  download goes to a temporary file of its own, deleted on failure): the next call
  fetches that file again from byte 0;
* it checks only the size of what it downloads, not its SHA-256 or git blob id:
  ``verify_snapshot`` does that, for every file.
"""

import hashlib
import io

import pytest
import torch
from huggingface_hub import constants as hf_constants
from safetensors.torch import save as safetensors_bytes

from ctxkit.core.hub import HubDownloadError, HubNotCachedError, hub_cache_dir, hub_snapshot
from hub_server import HubServer, commit_id, git_blob_id, go_offline, use_hub

CHUNK = 4096


def safetensors_file(rows: int = 2) -> bytes:
    return safetensors_bytes({"weight": torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)})


def pickle_file() -> bytes:
    buffer = io.BytesIO()
    torch.save({"weight": torch.eye(2)}, buffer)
    return buffer.getvalue()


def bert_files(**weights: bytes) -> dict:
    return {"config.json": b'{"model_type": "bert", "hidden_size": 2}', "vocab.txt": b"[PAD]\n[UNK]\nhello\n",
            "README.md": b"# a tiny repository\n", **weights}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The fake Hub, with huggingface_hub pointed at it and its cache under ``tmp_path``."""
    with HubServer() as server:
        use_hub(monkeypatch, server.url, tmp_path / "hf")
        monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
        yield server


def blobs(repo_id: str):
    folder = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}" / "blobs"
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def leftovers():
    return sorted(str(p) for p in hub_cache_dir().rglob("*.incomplete"))


def assert_files(folder, files: dict, names):
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    for name in names:
        assert (folder / name).read_bytes() == files[name], name


def test_safetensors_preferred_and_served_from_cache(hub, monkeypatch):
    files = bert_files(**{"model.safetensors": safetensors_file(), "pytorch_model.bin": pickle_file()})
    commit = hub.add("org/both", files)

    folder = hub_snapshot("org/both", progress=True)
    assert folder.name == commit and folder.parent.parent.name == "models--org--both"
    assert folder.is_relative_to(hub_cache_dir())
    assert_files(folder, files, ["config.json", "vocab.txt", "model.safetensors"])  # no README, no pickle
    assert not hub.file_requests("pytorch_model.bin") and not hub.file_requests("README.md")
    assert len(hub.file_requests("model.safetensors", "GET")) == 1

    hub.clear()
    assert hub_snapshot("org/both", progress=False) == folder
    assert hub.requests == []  # the cache answered

    hub.stop()
    assert hub_snapshot("org/both", progress=False) == folder
    go_offline(monkeypatch)
    assert hub_snapshot("org/both", progress=False) == folder
    assert hub.requests == []


def test_pickles_when_no_safetensors(hub, monkeypatch):
    files = bert_files(**{"pytorch_model.bin": pickle_file()})
    hub.add("legacy-model", files)  # a top-level id, as gpt2 was

    folder = hub_snapshot("legacy-model", progress=False)
    assert_files(folder, files, ["config.json", "vocab.txt", "pytorch_model.bin"])
    assert len(hub.file_requests("pytorch_model.bin", "GET")) == 1

    hub.clear()
    go_offline(monkeypatch)
    assert hub_snapshot("legacy-model", progress=False) == folder
    assert hub.requests == []


def test_pinned_revision_comes_from_the_cache(hub):
    old = bert_files(**{"model.safetensors": safetensors_file(2)})
    a = hub.add("org/pinned", old, commit=commit_id("A"))

    folder_a = hub_snapshot("org/pinned", revision=a, progress=False)
    assert folder_a.name == a
    assert not any("/revision/" in r.path for r in hub.requests)  # a commit hash needs no lookup
    assert_files(folder_a, old, ["config.json", "vocab.txt", "model.safetensors"])

    hub.clear()
    assert hub_snapshot("org/pinned", revision=a, progress=False) == folder_a
    assert hub.requests == []

    new = bert_files(**{"model.safetensors": safetensors_file(3)})
    b = hub.add("org/pinned", new, commit=commit_id("B"))  # the branch moves on
    assert hub_snapshot("org/pinned", revision=a, progress=False) == folder_a
    assert hub.requests == []
    folder_b = hub_snapshot("org/pinned", revision=b, progress=False)
    assert folder_b.name == b
    assert_files(folder_b, new, ["config.json", "vocab.txt", "model.safetensors"])
    assert (folder_a / "model.safetensors").read_bytes() == old["model.safetensors"]


def test_offline_and_not_cached(hub, monkeypatch):
    hub.add("org/elsewhere", bert_files(**{"model.safetensors": safetensors_file()}))
    go_offline(monkeypatch)
    with pytest.raises(HubNotCachedError) as err:
        hub_snapshot("org/elsewhere", progress=False)
    assert "org/elsewhere" in str(err.value) and str(hub_cache_dir()) in str(err.value)
    assert "HF_HUB_OFFLINE" in str(err.value) and "\n" not in str(err.value)
    assert hub.requests == []


def test_offline_files_by_url_are_one_line_and_a_capped_list(tmp_path, monkeypatch):
    # Issue 44 item 7: the missing files and their URLs were one line, however many there were.
    from ctxkit.core.errors import UserError
    from ctxkit.core.fetch import fetch_files

    monkeypatch.setenv("CTXKIT_OFFLINE", "1")
    files = {f"part{i:02d}.bin": (f"https://example.org/release/part{i:02d}.bin", None) for i in range(30)}
    with pytest.raises(UserError) as err:
        fetch_files(files, tmp_path / "model", progress=False)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"{tmp_path / 'model'}: 30 file(s) missing and offline mode is set: fetch them where the network "
                        "is reachable, into this folder:")
    assert lines[1:] == [f"  part{i:02d}.bin: https://example.org/release/part{i:02d}.bin" for i in range(20)] + ["  ... and 10 more"]


def test_unknown_repository_and_revision(hub):
    with pytest.raises(HubDownloadError, match="no such model repository") as err:
        hub_snapshot("org/missing", progress=False)
    assert "org/missing" in str(err.value) and hub.url in str(err.value)

    hub.add("org/there", bert_files(**{"model.safetensors": safetensors_file()}))
    with pytest.raises(HubDownloadError, match="has no revision 'v9'"):
        hub_snapshot("org/there", revision="v9", progress=False)
    with pytest.raises(HubDownloadError, match="has no revision"):
        hub_snapshot("org/there", revision=commit_id("never"), progress=False)


def test_dropped_connection_is_resumed_within_the_call(hub):
    files = bert_files(**{"model.safetensors": safetensors_file(8192)})  # 64 KiB of weights
    cut = 4 * CHUNK
    assert len(files["model.safetensors"]) > 2 * cut
    hub.add("org/flaky", files)
    hub.cut_after["model.safetensors"] = cut

    folder = hub_snapshot("org/flaky", progress=False)
    assert [r.range for r in hub.file_requests("model.safetensors", "GET")] == [None, f"bytes={cut}-"]
    assert_files(folder, files, ["config.json", "vocab.txt", "model.safetensors"])
    assert leftovers() == []


def test_interrupted_download_then_run_again(hub):
    files = bert_files(**{"model.safetensors": safetensors_file(8192)})
    sha256 = hashlib.sha256(files["model.safetensors"]).hexdigest()
    cut = 4 * CHUNK
    commit = hub.add("org/cut", files)
    hub.cut_after["model.safetensors"] = cut
    hub.fail_gets["model.safetensors"] = 1  # the resume attempt meets a 503: the call gives up

    with pytest.raises(HubDownloadError, match="resume") as err:
        hub_snapshot("org/cut", progress=False)
    assert "org/cut" in str(err.value) and "503" in str(err.value)
    assert [r.range for r in hub.file_requests("model.safetensors", "GET")] == [None, f"bytes={cut}-"]
    snapshot = hub_cache_dir() / "models--org--cut" / "snapshots" / commit
    assert (snapshot / "config.json").is_file() and not (snapshot / "model.safetensors").exists()
    assert sha256 not in blobs("org/cut") and leftovers() == []  # the partial file is not kept

    hub.clear()
    folder = hub_snapshot("org/cut", progress=False)
    assert folder == snapshot
    assert_files(folder, files, ["config.json", "vocab.txt", "model.safetensors"])
    # huggingface_hub 2.4 starts the cut file over; the complete ones are not fetched again
    assert [r.range for r in hub.file_requests("model.safetensors", "GET")] == [None]
    assert not hub.file_requests("config.json", "GET") and not hub.file_requests("vocab.txt", "GET")


def test_corrupted_download_is_removed(hub):
    files = bert_files(**{"model.safetensors": safetensors_file(64)})
    sha256 = hashlib.sha256(files["model.safetensors"]).hexdigest()
    commit = hub.add("org/corrupt", files)
    hub.corrupt["model.safetensors"] = True

    with pytest.raises(HubDownloadError, match="checksums") as err:
        hub_snapshot("org/corrupt", progress=False)
    assert sha256 in str(err.value)
    snapshot = hub_cache_dir() / "models--org--corrupt" / "snapshots" / commit
    assert not (snapshot / "model.safetensors").exists() and not (snapshot / "model.safetensors").is_symlink()
    assert sha256 not in blobs("org/corrupt") and leftovers() == []
    assert (snapshot / "config.json").is_file()

    hub.corrupt.clear()
    hub.clear()
    folder = hub_snapshot("org/corrupt", progress=False)
    assert folder == snapshot
    assert_files(folder, files, ["config.json", "vocab.txt", "model.safetensors"])
    assert len(hub.file_requests("model.safetensors", "GET")) == 1
    assert sha256 in blobs("org/corrupt")


def test_a_tampered_tokenizer_json_is_removed(hub):
    # Issue 44 item 4: only weight files were checked; every other file is checked against its
    # git blob id, the Hub's record of it (the name of its blob in the cache).
    files = bert_files(**{"model.safetensors": safetensors_file(), "tokenizer.json": b'{"version": "1.0", "model": {}}'})
    commit = hub.add("org/tampered", files)
    hub.corrupt["tokenizer.json"] = True
    served = bytearray(files["tokenizer.json"])
    served[len(served) // 2] ^= 0xFF  # what the stand-in sends instead

    with pytest.raises(HubDownloadError) as err:
        hub_snapshot("org/tampered", progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"tokenizer.json: git blob id {git_blob_id(bytes(served))}, the Hub records {git_blob_id(files['tokenizer.json'])}" in msg
    snapshot = hub_cache_dir() / "models--org--tampered" / "snapshots" / commit
    assert not (snapshot / "tokenizer.json").exists() and not (snapshot / "tokenizer.json").is_symlink()
    assert git_blob_id(files["tokenizer.json"]) not in blobs("org/tampered")

    hub.corrupt.clear()
    folder = hub_snapshot("org/tampered", progress=False)
    assert_files(folder, files, ["config.json", "vocab.txt", "tokenizer.json", "model.safetensors"])
