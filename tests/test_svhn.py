"""#31 item 2: SVHN as its authors distribute it (`test_32x32.mat`, read as torchvision.datasets.SVHN reads it,
with scipy.io.loadmat) is an OOD set of the open-set runs, found by `shiftlab datasets`; a synthetic .mat here."""
from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from shiftlab.cli import main as cli_main
from shiftlab.datasets import DatasetError, build_dataset
from shiftlab.datasets.openset import OpenSetDataset


def _savemat(path, arrays: dict) -> None:
    # scipy imported by the tests that write a .mat file, not while the tests are collected (tests/conftest.py)
    pytest.importorskip("scipy.io").savemat(path, arrays)


def _svhn_mat(folder, n: int = 7, seed: int = 0) -> np.ndarray:
    """A file shaped as SVHN's: X (32, 32, 3, N) uint8, y (N, 1) digits 1..10. Returns the images (N, 32, 32, 3)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    folder.mkdir(parents=True)
    _savemat(folder / "test_32x32.mat", {"X": images.transpose(1, 2, 3, 0),
                                          "y": rng.integers(1, 11, size=(n, 1)).astype(np.uint8)})
    return images


def test_svhn_mat_is_an_ood_pool_read_image_by_image(tmp_path):
    images = _svhn_mat(tmp_path / "svhn", n=12)
    ds = build_dataset("svhn", tmp_path)
    assert len(ds) == 12 and ds.classnames == [] and all(label is None for _, label in ds.samples)
    assert [p for p, _ in ds.samples][:3] == ["test_32x32.mat#00", "test_32x32.mat#01", "test_32x32.mat#02"]
    assert ds.found_layout == "SVHN's test_32x32.mat"
    for i in (0, 5, 11):
        assert np.array_equal(np.asarray(ds.image(i)), images[i]) and ds.image(i).mode == "RGB"
        assert ds.content_digest(i) == hashlib.sha256(images[i].tobytes()).hexdigest()
        assert ds.source(i) == str(tmp_path / "svhn" / f"test_32x32.mat#{i:02d}")
    # a DataLoader worker gets the dataset without its array, and reads the file itself
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._images is None and np.array_equal(np.asarray(copy.image(3)), images[3])
    # an open-set stream draws its images like any OOD set's
    _svhn_mat(tmp_path / "id" / "svhn", n=4, seed=1)
    id_set = build_dataset("svhn", tmp_path / "id")   # any dataset stands in for the ID part's shape here
    id_set.samples, id_set.classnames = [(p, 0) for p, _ in id_set.samples], ["x"]
    mixed = OpenSetDataset(id_set, {"svhn": ds}, ratio=1.0, seed=0)
    drawn = mixed.drawn[0][1]
    assert np.array_equal(np.asarray(mixed.image(4)), images[drawn]) and mixed.label(4) is None
    # the .mat file's own images as the ID part: byte-identical to the OOD pool's (issue 40 case 12)
    same = build_dataset("svhn", tmp_path)
    same.samples, same.classnames = [(p, 0) for p, _ in same.samples[:4]], ["x"]
    with pytest.raises(DatasetError, match=r"^4 image\(s\) of the OOD set\(s\) are byte for byte images of the "
                                           r"in-distribution dataset \(e\.g\. svhn: .*test_32x32\.mat#00 = "):
        OpenSetDataset(same, {"svhn": ds}, ratio=1.0, seed=0)


def test_a_mat_file_that_is_not_svhns_is_one_line(tmp_path):
    (tmp_path / "svhn").mkdir()
    _savemat(tmp_path / "svhn" / "test_32x32.mat", {"X": np.zeros((32, 32, 5), dtype=np.float32)})
    with pytest.raises(DatasetError, match=r"^svhn: .*test_32x32.mat holds X of shape \(32, 32, 5\) and type float32; "
                                           r"SVHN's file holds X as \(32, 32, 3, N\) uint8 images$"):
        build_dataset("svhn", tmp_path)
    (tmp_path / "svhn" / "test_32x32.mat").write_bytes(b"not a mat file at all")
    with pytest.raises(DatasetError, match=r"^svhn: .*test_32x32.mat is not a readable MATLAB file \("):
        build_dataset("svhn", tmp_path)


def test_shiftlab_datasets_finds_svhn(tmp_path, capsys):
    _svhn_mat(tmp_path / "SVHN", n=5)
    assert cli_main(["datasets", "--data", str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("svhn"))
    assert f"found: {tmp_path / 'SVHN'} (SVHN's test_32x32.mat; 5 images)" in line
