"""Published numbers appear only beside runs they can be compared with: same weights (by checksum),
same dataset and architecture, and the protocol each number was published with."""
from __future__ import annotations

import pytest

from shiftlab.results.published import OPENAI_RN50_SHA256, published_for_run, published_rows
from shiftlab.results.summary import summary_markdown


def _summary(**config):
    base = {"dataset": "imagenet-r", "model": "RN50", "pretrained": "openai", "checkpoint_sha256": OPENAI_RN50_SHA256}
    return {"config": {**base, **config}, "methods": {"tpt": {"top1": 60.0, "n": 10}}, "errors": 0}


def test_openai_rn50_checksum_is_the_one_in_its_official_url():
    import open_clip
    url = open_clip.get_pretrained_cfg("RN50", "openai").get("url", "")
    assert f"/{OPENAI_RN50_SHA256}/RN50.pt" in url


def test_unknown_random_or_other_weights_get_no_published_numbers():
    assert published_for_run(_summary(checkpoint_sha256=None)) == {}                 # a tag resolved elsewhere
    assert published_for_run(_summary(pretrained=None, checkpoint_sha256=None)) == {}  # random weights
    assert published_for_run(_summary(checkpoint_sha256="0" * 64)) == {}             # another file
    assert published_for_run(_summary(model="ViT-B-16")) == {}
    assert published_for_run(_summary(dataset="imagenet-a")) == {}
    # the same file under any name or path is comparable
    assert published_for_run(_summary(pretrained="/somewhere/weights.bin"))["tpt"]["seed_leaderboard"] == 58.9
    assert published_for_run(_summary(checkpoint_sha256=OPENAI_RN50_SHA256.upper()))


def test_each_number_only_beside_its_protocol():
    board = published_for_run(_summary(protocol="leaderboard"))
    assert board["tpt"]["seed_leaderboard"] == 58.9 and board["tpt"]["paper"] is None
    assert board["ctpt"]["paper_ece"] is None and board["tda"]["paper"] is None
    paper = published_for_run(_summary(protocol="paper"))
    assert paper["tpt"]["seed_leaderboard"] is None and paper["tpt"]["paper"] == 59.11
    assert paper["ctpt"]["paper_ece"] == 4.57 and paper["tda"]["paper"] == 62.58
    # the run identity's record wins over the config, and old runs without a protocol are leaderboard runs
    ident = {**_summary(checkpoint_sha256=None), "identity": {"shared": {"checkpoint_sha256": OPENAI_RN50_SHA256,
                                                                         "protocol": "paper"}}}
    assert published_for_run(ident)["tpt"]["paper"] == 59.11
    assert published_for_run(_summary())["tpt"]["paper"] is None
    with pytest.raises(ValueError, match="protocol must be one of leaderboard, paper"):
        published_rows("imagenet-r", "RN50", weights_sha256=OPENAI_RN50_SHA256, protocol="seed")


def test_summary_table_has_a_published_column_only_when_comparable():
    comparable = summary_markdown(_summary(), published_for_run(_summary()))
    assert "published top-1" in comparable and "| 58.9 |" in comparable
    random = _summary(pretrained=None, checkpoint_sha256=None)
    assert "published" not in summary_markdown(random, published_for_run(random))


def test_ece_is_recorded_with_15_and_20_bins_and_20_sits_beside_c_tpt_published_ece():
    from shiftlab.results.scoring import score_records
    # 15 bins: 0.72 falls in (0.667, 0.733], 0.74 in (0.733, 0.8]; 20 bins: both in (0.7, 0.75]
    recs = [{"correct": True, "label": 0, "top5": [0], "confidence": 0.72, "true_prob": 0.72},
            {"correct": False, "label": 0, "top5": [1], "confidence": 0.74, "true_prob": 0.1}]
    scored = score_records(recs)
    # 15 bins: |1 - 0.72| / 2 + |0 - 0.74| / 2; 20 bins: one bin, |0.5 - 0.73|
    assert scored["ece"] == pytest.approx(100 * (0.28 + 0.74) / 2)
    assert scored["ece20"] == pytest.approx(100 * 0.23)
    summary = _summary(protocol="paper")
    summary["methods"] = {"ctpt": {**scored, "top1": 50.0}}
    md = summary_markdown(summary, published_for_run(summary))
    head, _, row = md.splitlines()[2:5]
    cols = [c.strip() for c in head.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cols[4] == "ECE20" and cells[4] == "23.00"
    assert cols[-1] == "published ECE (20 bins)" and cells[-1] == "4.57"
    # a leaderboard run has no published ECE to compare with
    assert "published ECE" not in summary_markdown(_summary(), published_for_run(_summary()))


def test_weights_read_content_verified_from_the_official_hub_repo_are_openai_weights(tmp_path):
    """`make run` gets RN50 from open_clip's hub repo (a converted file whose SHA-256 is not OpenAI's):
    the published column is shown when the file was a cache blob whose content matches its name."""
    import hashlib
    import os

    import open_clip

    from shiftlab.models.checkpoints import weights_source
    repo = open_clip.get_pretrained_cfg("RN50", "openai")["hf_hub"].strip("/")
    assert repo == "timm/resnet50_clip.openai"
    data = b"a converted RN50 checkpoint stand-in"
    sha = hashlib.sha256(data).hexdigest()
    repo_dir = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))

    def cached(blob_name: str, rev: str) -> str:
        blob = repo_dir / "blobs" / blob_name
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo_dir / "snapshots" / rev / "open_clip_model.safetensors"
        link.parent.mkdir(parents=True)
        link.symlink_to(os.path.join("..", "..", "blobs", blob_name))
        return weights_source(link, sha)

    verified = cached(sha, "rev1")
    assert verified == f"hf-hub:{repo}"
    summary = _summary(checkpoint_sha256=sha, weights_source=verified, protocol="leaderboard")
    published = published_for_run(summary)
    assert published["tpt"]["seed_leaderboard"] == 58.9
    assert "58.9" in summary_markdown(summary, published)
    # recorded in the run identity, as the engine writes it
    ident = {"identity": {"shared": {"checkpoint_sha256": sha, "weights_source": verified}}}
    assert published_for_run({**_summary(checkpoint_sha256=None), **ident})["tpt"]["seed_leaderboard"] == 58.9
    # a blob whose name is not its content's digest, and the same bytes copied out of the cache: not shown
    mismatched = cached("f" * 64, "rev2")
    assert mismatched is None
    assert published_for_run(_summary(checkpoint_sha256=sha, weights_source=mismatched)) == {}
    copy = tmp_path / "elsewhere" / "open_clip_model.safetensors"
    copy.parent.mkdir()
    copy.write_bytes(data)
    assert weights_source(copy, sha) is None
    assert published_for_run(_summary(checkpoint_sha256=sha, weights_source=None)) == {}
    # another repo's verified blob, or the RN50 repo claimed for ViT-B-16, is not OpenAI's RN50
    assert published_for_run(_summary(checkpoint_sha256=sha, weights_source="hf-hub:someorg/rn50")) == {}
    assert published_for_run(_summary(model="ViT-B-16", checkpoint_sha256=sha, weights_source=verified)) == {}
    assert weights_source(copy, OPENAI_RN50_SHA256) == "openai-url"


def test_the_rows_are_what_each_method_declares(monkeypatch):
    from shiftlab.methods.catalogue.declarations import spec
    mta = spec("mta")   # what the published table reads
    tpt_readme = next(p["source"] for p in spec("tpt").published if p["value"] == 59.11)   # TPT's README
    paper = dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=60.5, source=tpt_readme)
    vit = {**paper, "backbone": "ViT-B/16", "value": 70.0}
    monkeypatch.setattr(mta, "published", (*mta.published, vit, paper))
    row = published_for_run(_summary(protocol="paper"))["mta"]
    assert (row["label"], row["paper"], row["paper_ece"]) == ("MTA", 60.5, None)    # the RN50 number, not the ViT's
    assert published_for_run(_summary())["mta"]["seed_leaderboard"] == 58.4
    # a method without an RN50 ImageNet-R number has no row
    assert "zero" not in published_for_run(_summary(protocol="paper"))
