"""Downloads against a local HTTP server (with Range support), safe extraction, and the CLI command."""
from __future__ import annotations

import argparse
import hashlib
import io
import re
import socket
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from _synthetic import make_imagenet_r
from shiftlab.commands import download as download_command
from shiftlab.datasets import (
    ChecksumError,
    DownloadError,
    UnsafeArchiveError,
    build_dataset,
    download_dataset,
    download_file,
    safe_extract,
)

PAYLOAD = bytes(range(256)) * 4000  # 1 MB, position-dependent content so misplaced bytes are caught


class _RangeHandler(BaseHTTPRequestHandler):
    """Serves ``server.files``; honours ``Range: bytes=N-`` unless ``server.ignore_range``."""

    def do_GET(self):  # noqa: N802 - http.server naming
        server = self.server
        server.requests.append((self.path, self.headers.get("Range")))
        data = server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start, requested = 0, self.headers.get("Range")
        if requested and not server.ignore_range:
            start = int(re.match(r"bytes=(\d+)-", requested).group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.cut_after is not None:  # simulate a dropped connection mid-body
            self.wfile.write(body[: server.cut_after])
            server.cut_after = None
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    httpd.files, httpd.requests, httpd.ignore_range, httpd.cut_after = {}, [], False, None
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unused_port_url(path: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


# ------------------------------------------------------------------------------------ download_file

def test_download_with_checksum(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    dest = download_file(server.url + "/f.bin", tmp_path / "f.bin", sha256=_sha(PAYLOAD), size=len(PAYLOAD),
                         progress=False, chunk_size=4096)
    assert dest.read_bytes() == PAYLOAD and not (tmp_path / "f.bin.part").exists()
    # An existing verified file is not fetched again.
    download_file(server.url + "/f.bin", dest, sha256=_sha(PAYLOAD), progress=False)
    assert len(server.requests) == 1


def test_resume_partial_download_with_range(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    (tmp_path / "f.bin.part").write_bytes(PAYLOAD[:300_001])
    dest = download_file(server.url + "/f.bin", tmp_path / "f.bin", sha256=_sha(PAYLOAD), progress=False)
    assert server.requests == [("/f.bin", "bytes=300001-")]
    assert dest.read_bytes() == PAYLOAD


def test_server_ignoring_range_restarts(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    server.ignore_range = True
    (tmp_path / "f.bin.part").write_bytes(b"garbage that must not end up in the file")
    dest = download_file(server.url + "/f.bin", tmp_path / "f.bin", sha256=_sha(PAYLOAD), progress=False)
    assert server.requests[0][1] is not None and dest.read_bytes() == PAYLOAD


def test_complete_part_answered_416(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    (tmp_path / "f.bin.part").write_bytes(PAYLOAD)
    dest = download_file(server.url + "/f.bin", tmp_path / "f.bin", sha256=_sha(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD


def test_interrupted_download_keeps_part_then_resumes(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    server.cut_after = 100_000
    with pytest.raises(DownloadError, match="rerun to resume"):
        download_file(server.url + "/f.bin", tmp_path / "f.bin", progress=False)
    assert (tmp_path / "f.bin.part").stat().st_size == 100_000 and not (tmp_path / "f.bin").exists()
    dest = download_file(server.url + "/f.bin", tmp_path / "f.bin", sha256=_sha(PAYLOAD), progress=False)
    assert server.requests[-1] == ("/f.bin", "bytes=100000-") and dest.read_bytes() == PAYLOAD


@pytest.mark.parametrize("kind", ["sha256", "size"])
def test_wrong_checksum_leaves_nothing(server, tmp_path, kind):
    server.files["/f.bin"] = PAYLOAD
    kwargs = {"sha256": "0" * 64} if kind == "sha256" else {"size": len(PAYLOAD) + 1}
    with pytest.raises(ChecksumError) as info:
        download_file(server.url + "/f.bin", tmp_path / "f.bin", progress=False, **kwargs)
    message = str(info.value)
    assert ("0" * 64 in message and _sha(PAYLOAD) in message) if kind == "sha256" else str(len(PAYLOAD)) in message
    assert list(tmp_path.iterdir()) == []


def test_existing_file_with_wrong_checksum_is_reported_not_deleted(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"user's own file")
    with pytest.raises(ChecksumError, match="delete"):
        download_file("http://unused.invalid/f.bin", tmp_path / "f.bin", sha256="0" * 64, progress=False)
    assert (tmp_path / "f.bin").exists()


def test_file_url(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(PAYLOAD)
    (tmp_path / "copy.bin.part").write_bytes(b"stale")  # file:// ignores Range: must restart, not append
    dest = download_file(source.as_uri(), tmp_path / "copy.bin", sha256=_sha(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD


def test_http_404(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404") as info:
        download_file(server.url + "/missing.tar", tmp_path / "x.tar", progress=False)
    assert server.url + "/missing.tar" in str(info.value)


def test_offline_error_names_url_and_destination(tmp_path):
    url = _unused_port_url("/imagenet-r.tar")
    with pytest.raises(DownloadError) as info:
        download_file(url, tmp_path / "imagenet-r.tar", progress=False)
    assert url in str(info.value) and str(tmp_path / "imagenet-r.tar") in str(info.value)


# ------------------------------------------------------------------------------------ safe_extract

def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_safe_extract_tar_gz(tmp_path):
    archive = _tar(tmp_path / "ok.tar.gz", [(_member("d/a.txt"), b"hello"),
                                             (_member("d/link", tarfile.SYMTYPE, "a.txt"), None)], "w:gz")
    target = safe_extract(archive, tmp_path / "out")
    assert (target / "d" / "a.txt").read_bytes() == b"hello" and (target / "d" / "link").read_bytes() == b"hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.tar.gz", "out"]
    with pytest.raises(FileExistsError):
        safe_extract(archive, target)


@pytest.mark.parametrize("case", ["absolute", "dotdot", "symlink", "symlink_abs", "symlink_chain", "hardlink",
                                  "hardlink_abs", "device", "fifo"])
def test_malicious_tar_refused(tmp_path, case):
    outside = tmp_path / "outside.txt"
    members = {
        "absolute": [(_member(str(outside)), b"pwned")],
        "dotdot": [(_member("d/../../outside.txt"), b"pwned")],
        "symlink": [(_member("d/link", tarfile.SYMTYPE, "../../outside.txt"), None),
                    (_member("d/link"), b"pwned")],
        "symlink_abs": [(_member("link", tarfile.SYMTYPE, str(outside)), None)],
        # Each target looks inside on paper; together they step out of the target folder.
        "symlink_chain": [(_member("sub", tarfile.DIRTYPE), None), (_member("up", tarfile.SYMTYPE, "sub/.."), None),
                          (_member("up2", tarfile.SYMTYPE, "up/.."), None), (_member("up2/outside.txt"), b"pwned")],
        "hardlink": [(_member("link", tarfile.LNKTYPE, "../outside.txt"), None)],
        "hardlink_abs": [(_member("link", tarfile.LNKTYPE, str(outside)), None)],
        "device": [(_member("dev", tarfile.CHRTYPE), None)],
        "fifo": [(_member("fifo", tarfile.FIFOTYPE), None)],
    }[case]
    archive = _tar(tmp_path / "evil.tar", [(_member("fine.txt"), b"ok")] + members)
    with pytest.raises(UnsafeArchiveError, match="refusing"):
        safe_extract(archive, tmp_path / "out")
    assert not outside.exists() and not outside.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar"]  # no target, no staging left


def _zip(path: Path, entries: list[tuple[str, bytes]], symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, "../../outside.txt")
    return path


def test_safe_extract_zip(tmp_path):
    archive = _zip(tmp_path / "ok.zip", [("sketch/n01440764/a.JPEG", b"x"), ("sketch/empty/", b"")])
    target = safe_extract(archive, tmp_path / "out")
    assert (target / "sketch" / "n01440764" / "a.JPEG").read_bytes() == b"x" and (target / "sketch" / "empty").is_dir()


@pytest.mark.parametrize("name", ["/abs/outside.txt", "../outside.txt", "a/../../outside.txt", "..\\outside.txt",
                                  "C:/x.txt"])
def test_malicious_zip_refused(tmp_path, name):
    archive = _zip(tmp_path / "evil.zip", [("fine.txt", b"ok"), (name, b"pwned")])
    with pytest.raises(UnsafeArchiveError, match="refusing"):
        safe_extract(archive, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.zip"]


def test_zip_symlink_refused(tmp_path):
    archive = _zip(tmp_path / "evil.zip", [("fine.txt", b"ok")], symlink="link")
    with pytest.raises(UnsafeArchiveError, match="symbolic link"):
        safe_extract(archive, tmp_path / "out")


def test_corrupt_archive(tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 50)
    with pytest.raises(DownloadError, match="corrupt"):
        safe_extract(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ download_dataset + CLI

def _imagenet_r_tarball(tmp_path: Path, classes=None) -> bytes:
    make_imagenet_r(tmp_path / "src", classes=classes, size=(16, 12))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(tmp_path / "src" / "imagenet-r", arcname="imagenet-r")
    return buffer.getvalue()


def test_download_dataset_records_checksum_and_builds(server, tmp_path, capsys):
    data = _imagenet_r_tarball(tmp_path)
    server.files["/imagenet-r.tar"] = data
    root = tmp_path / "data"
    target = download_dataset("imagenet-r", root, url=server.url + "/imagenet-r.tar", progress=False)
    assert target == root / "imagenet-r" and len(build_dataset("imagenet-r", root)) == 200
    record = (root / "imagenet-r.sha256").read_text()
    assert record.startswith(f"{_sha(data)}  imagenet-r.tar") and f"# size {len(data)}" in record
    assert _sha(data) in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["imagenet-r", "imagenet-r.sha256"]  # archive removed
    # Present already: nothing downloaded.
    assert download_dataset("imagenet-r", root, url=server.url + "/imagenet-r.tar", progress=False) == target
    assert len(server.requests) == 1
    # A later download is verified against the recorded digest.
    import shutil
    shutil.rmtree(target)
    server.files["/imagenet-r.tar"] = _imagenet_r_tarball(tmp_path / "other", classes=[0, 1])
    with pytest.raises(ChecksumError, match=_sha(data)):
        download_dataset("imagenet-r", root, url=server.url + "/imagenet-r.tar", progress=False)
    assert sorted(p.name for p in root.iterdir()) == ["imagenet-r.sha256"]


def test_a_root_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    """`shiftlab download imagenet-r --root FILE` ended in "FILE: File exists"."""
    from shiftlab.cli import main as cli_main
    root = tmp_path / "data.txt"
    root.write_text("mine")
    with pytest.raises(SystemExit) as info:
        cli_main(["download", "imagenet-r", "--root", str(root), "--url", "file:///nowhere.tar"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert f"argument --root: {root} is a file, not a folder" in err[0] and root.read_text() == "mine"


def test_download_dataset_wrong_sha_leaves_nothing(server, tmp_path):
    server.files["/imagenet-r.tar"] = _imagenet_r_tarball(tmp_path)
    root = tmp_path / "data"
    with pytest.raises(ChecksumError):
        download_dataset("imagenet-r", root, url=server.url + "/imagenet-r.tar", sha256="ab" * 32, progress=False)
    assert list(root.iterdir()) == []


def test_download_dataset_invalid_archive_not_published(server, tmp_path):
    archive = _tar(tmp_path / "x.tar", [(_member("imagenet-r/n01443537/a.jpg"), b"x")])
    server.files["/imagenet-r.tar"] = archive.read_bytes()
    root = tmp_path / "data"
    with pytest.raises(DownloadError, match="does not contain a valid imagenet-r"):
        download_dataset("imagenet-r", root, url=server.url + "/imagenet-r.tar", progress=False)
    assert not (root / "imagenet-r").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # staging folder cleaned up


@pytest.mark.parametrize("bad", ["unsafe", "corrupt", "not_a_dataset"])
def test_refused_or_corrupt_archive_leaves_no_digest_then_the_genuine_one_is_accepted(server, tmp_path, bad):
    # A digest recorded before the archive is accepted would pin a refused one: the genuine archive
    # would then be rejected as corrupt until the user found and deleted <root>/<name>.sha256.
    bad_archive = {
        "unsafe": lambda: _tar(tmp_path / "b.tar", [(_member("imagenet-r/../../evil.txt"), b"x")]),
        "corrupt": lambda: (tmp_path / "b.tar").write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 50) and tmp_path / "b.tar",
        "not_a_dataset": lambda: _tar(tmp_path / "b.tar", [(_member("imagenet-r/n01443537/a.jpg"), b"x")]),
    }[bad]()
    server.files["/imagenet-r.tar"] = bad_archive.read_bytes()
    root = tmp_path / "data"
    url = server.url + "/imagenet-r.tar"
    with pytest.raises(DownloadError) as info:
        download_dataset("imagenet-r", root, url=url, progress=False)
    assert "no checksum was recorded" in str(info.value)
    assert list(root.iterdir()) == []  # no digest, no archive, no staging folder, no dataset
    assert not (tmp_path / "evil.txt").exists()

    genuine = _imagenet_r_tarball(tmp_path)
    server.files["/imagenet-r.tar"] = genuine
    assert download_dataset("imagenet-r", root, url=url, progress=False) == root / "imagenet-r"
    assert (root / "imagenet-r.sha256").read_text().startswith(f"{_sha(genuine)}  imagenet-r.tar")
    assert len(build_dataset("imagenet-r", root)) == 200


def test_bad_archive_placed_by_the_user_is_kept_and_not_recorded(tmp_path):
    placed = _tar(tmp_path / "imagenet-r.tar", [(_member("imagenet-r/n01443537/a.jpg"), b"x")])
    with pytest.raises(DownloadError, match="does not contain a valid imagenet-r"):
        download_dataset("imagenet-r", tmp_path, progress=False)
    assert placed.is_file() and not (tmp_path / "imagenet-r.sha256").exists()


def test_download_dataset_offline_message(tmp_path):
    url = _unused_port_url("/imagenet-r.tar")
    with pytest.raises(DownloadError) as info:
        download_dataset("imagenet-r", tmp_path, url=url, progress=False)
    message = str(info.value)
    assert url in message and str(tmp_path / "imagenet-r.tar") in message and str(tmp_path / "imagenet-r") in message


def test_sketch_needs_manual_download(tmp_path):
    with pytest.raises(DownloadError, match="Kaggle") as info:
        download_dataset("imagenet-sketch", tmp_path)
    assert str(tmp_path / "ImageNet-Sketch.zip") in str(info.value)


def test_sketch_archive_placed_by_hand_is_extracted(tmp_path):
    from shiftlab.datasets.classes import imagenet_wnids
    wnids = imagenet_wnids()
    entries = [(f"sketch/{w}/", b"") for w in wnids] + [(f"sketch/{wnids[3]}/sketch_1.JPEG", b"not decoded here")]
    _zip(tmp_path / "ImageNet-Sketch.zip", entries)
    target = download_dataset("imagenet-sketch", tmp_path, progress=False, keep_archive=True)
    assert target == tmp_path / "imagenet-sketch"
    ds = build_dataset("imagenet-sketch", tmp_path)
    assert ds.samples == [(f"{wnids[3]}/sketch_1.JPEG", 3)] and len(ds.classnames) == 1000


def test_existing_incomplete_dataset_folder_is_not_overwritten(tmp_path):
    (tmp_path / "imagenet-r" / "n01443537").mkdir(parents=True)
    with pytest.raises(DownloadError, match="exists but is not a complete imagenet-r"):
        download_dataset("imagenet-r", tmp_path, url=_unused_port_url("/x.tar"), progress=False)
    assert (tmp_path / "imagenet-r" / "n01443537").is_dir()


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shiftlab")
    download_command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_download(server, tmp_path, capsys):
    data = _imagenet_r_tarball(tmp_path, classes=[0, 5])
    server.files["/r.tar"] = data
    args = _cli(["download", "imagenet-r", "--root", str(tmp_path / "d"), "--url", server.url + "/r.tar",
                 "--sha256", _sha(data), "--no-progress", "--keep-archive"])
    assert args.func is download_command.run
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert "2 images in 200 classes" in captured.out and "198 of 200" in captured.err
    assert (tmp_path / "d" / "imagenet-r.tar").exists()  # --keep-archive


def test_cli_offline_returns_error(tmp_path, capsys):
    url = _unused_port_url("/r.tar")
    args = _cli(["download", "imagenet-a", "--root", str(tmp_path), "--url", url, "--no-progress"])
    assert download_command.run(args) == 1
    err = capsys.readouterr().err
    assert url in err and str(tmp_path / "imagenet-a.tar") in err


@pytest.mark.slow
def test_split_dataset_download_extracts_next_to_the_split_file_and_verifies(server, tmp_path):
    # A stand-in for 102flowers.tgz (jpg/image_*.jpg) and CoOp's split file put there by the user first.
    import json

    from _synthetic import make_split_dataset
    make_split_dataset(tmp_path / "src", "flowers102", with_images=range(102))
    listed = json.loads((tmp_path / "src" / "oxford_flowers" / "split_zhou_OxfordFlowers.json").read_text())["test"]
    for rel, _, _ in listed:
        (tmp_path / "src" / "oxford_flowers" / "jpg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "oxford_flowers" / "jpg" / rel).write_bytes(b"x")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(tmp_path / "src" / "oxford_flowers" / "jpg", arcname="jpg")
    server.files["/102flowers.tgz"] = buffer.getvalue()
    root = tmp_path / "data"
    (root / "oxford_flowers").mkdir(parents=True)
    (root / "oxford_flowers" / "split_zhou_OxfordFlowers.json").write_text(json.dumps({"test": listed}))
    got = download_dataset("flowers", root, url=server.url + "/102flowers.tgz", progress=False)
    assert got == root / "oxford_flowers"
    ds = build_dataset("flowers102", root)
    assert ds.root == root / "oxford_flowers" / "jpg" and len(ds) == 2463 and ds.missing_samples == 0
    assert (root / "flowers102.sha256").read_text().startswith(_sha(buffer.getvalue()))
    # present now: nothing is downloaded again
    assert download_dataset("flowers102", root, url=server.url + "/102flowers.tgz", progress=False) == ds.root
    assert len(server.requests) == 1


def test_split_dataset_archive_without_its_images_is_refused(server, tmp_path):
    server.files["/102flowers.tgz"] = _tar(tmp_path / "x.tar", [(_member("other/a.jpg"), b"x")]).read_bytes()
    with pytest.raises(DownloadError, match="holds none of the image folders expected"):
        download_dataset("flowers102", tmp_path / "data", url=server.url + "/102flowers.tgz", progress=False)
    assert list((tmp_path / "data").iterdir()) == []


def test_manual_cross_dataset_names_the_source_and_the_folder(tmp_path):
    with pytest.raises(DownloadError, match="UCF-101-midframes.zip") as info:
        download_dataset("ucf101", tmp_path)
    assert str(tmp_path / "ucf101") in str(info.value)
