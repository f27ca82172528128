"""Checkpoints are signed with Ed25519 outside the database, refused when anything in them is off, and
still verify after the key is rotated."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from joserfc import jws
from joserfc.jwk import KeySet, OKPKey

from gateway.audit.checkpoints import (
    ALGORITHM,
    MAX_COVER,
    TYPE,
    CheckpointError,
    CheckpointSigner,
    CheckpointUnverifiable,
    append,
    parse,
    read_all,
    trusted_keys,
)
from store.canonical import canonical_json

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HASHES = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(1, 6)]


def signer_in(tmp_path: Path) -> CheckpointSigner:
    return CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")


def signed(signer: CheckpointSigner, seq: int = 5, from_seq: int = 2) -> str:
    (line,) = signer.sign(
        log_id=HASHES[0],
        seq=seq,
        hash_=HASHES[seq - 1],
        from_seq=from_seq,
        hashes=HASHES[from_seq:seq],
        now=NOW,
    )
    return line


def test_a_checkpoint_round_trips_to_what_it_vouches_for(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)

    made = parse(signed(signer), trusted_keys(tmp_path / "trusted.jwks"), "here:1")

    anchor = made.anchor
    assert (anchor.log_id, anchor.seq, anchor.hash, anchor.from_seq) == (HASHES[0], 5, HASHES[4], 2)
    assert anchor.digests == tuple(h[:16] for h in HASHES[2:5])
    assert made.kid == signer.kid and made.at == "2026-12-01T12:00:00.000000Z"
    assert "here:1" in anchor.source and signer.kid in anchor.source


def test_the_private_key_is_made_once_for_its_owner_only_and_its_public_half_trusted(tmp_path: Path) -> None:
    first, second = signer_in(tmp_path), signer_in(tmp_path)

    assert first.kid == second.kid
    assert stat.S_IMODE((tmp_path / "key.jwk").stat().st_mode) == 0o600
    trusted = json.loads((tmp_path / "trusted.jwks").read_text())["keys"]
    assert [k["kid"] for k in trusted] == [first.kid]
    assert "d" not in trusted[0]


def test_a_flipped_signature_byte_is_refused(tmp_path: Path) -> None:
    line = signed(signer_in(tmp_path))
    head, payload, signature = line.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[0] ^= 1
    forged = ".".join([head, payload, base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()])

    with pytest.raises(CheckpointUnverifiable, match="here:3"):
        parse(forged, trusted_keys(tmp_path / "trusted.jwks"), "here:3")


def test_an_edited_payload_is_refused(tmp_path: Path) -> None:
    line = signed(signer_in(tmp_path))
    head, payload, signature = line.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["seq"] = 4
    edited = base64.urlsafe_b64encode(canonical_json(body).encode()).rstrip(b"=").decode()

    with pytest.raises(CheckpointUnverifiable):
        parse(".".join([head, edited, signature]), trusted_keys(tmp_path / "trusted.jwks"), "here:1")


def test_a_key_that_is_not_trusted_is_refused_by_its_kid(tmp_path: Path) -> None:
    stranger = signer_in(tmp_path / "elsewhere")
    signer_in(tmp_path)

    with pytest.raises(CheckpointUnverifiable, match=stranger.kid):
        parse(signed(stranger), trusted_keys(tmp_path / "trusted.jwks"), "here:1")


def test_an_eddsa_header_is_refused_even_with_a_good_signature(tmp_path: Path) -> None:
    key = OKPKey.generate_key("Ed25519", auto_kid=True)
    (tmp_path / "trusted.jwks").write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    payload = json.loads(
        base64.urlsafe_b64decode(signed(signer_in(tmp_path / "other")).split(".")[1] + "==").decode()
    )
    line = jws.serialize_compact(
        {"alg": ALGORITHM, "kid": key.kid, "typ": TYPE},
        canonical_json(payload).encode(),
        key,
        algorithms=[ALGORITHM],
    )
    assert parse(line, trusted_keys(tmp_path / "trusted.jwks"), "ok:1").anchor.seq == 5
    head = base64.urlsafe_b64encode(
        json.dumps({"alg": "EdDSA", "kid": key.kid, "typ": TYPE}).encode()
    ).rstrip(b"=")
    relabelled = ".".join([head.decode(), *line.split(".")[1:]])

    with pytest.raises(CheckpointUnverifiable, match="alg Ed25519"):
        parse(relabelled, KeySet([key]), "here:1")


def test_after_rotation_checkpoints_of_both_keys_verify(tmp_path: Path) -> None:
    old = signer_in(tmp_path)
    before = signed(old)
    new = old.rotate()
    after = signed(new, seq=5, from_seq=4)

    keys = trusted_keys(tmp_path / "trusted.jwks")
    assert new.kid != old.kid
    assert {parse(before, keys, "a:1").kid, parse(after, keys, "a:2").kid} == {old.kid, new.kid}
    assert signer_in(tmp_path).kid == new.kid  # the key file now holds the new key


def test_two_appends_give_two_lines_that_read_back_in_order(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)
    append(tmp_path / "cp", signed(signer, seq=3, from_seq=0), NOW)
    path = append(tmp_path / "cp", signed(signer, seq=5, from_seq=3), NOW)

    assert len(path.read_text().splitlines()) == 2
    found = read_all([tmp_path / "cp", path], trusted_keys(tmp_path / "trusted.jwks"))  # duplicates dropped
    assert [c.anchor.seq for c in found] == [3, 5]


def test_a_bad_line_among_good_ones_is_named_by_file_and_line_never_skipped(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)
    path = append(tmp_path / "cp", signed(signer), NOW)
    with path.open("a") as fh:
        fh.write("not.a.checkpoint\n")

    with pytest.raises(CheckpointUnverifiable, match=f"{path}:2"):
        read_all([tmp_path / "cp"], trusted_keys(tmp_path / "trusted.jwks"))


def test_signing_refuses_an_empty_log_or_hashes_that_miss_the_range(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)

    with pytest.raises(CheckpointError, match="empty"):
        signer.sign(log_id="", seq=0, hash_="", from_seq=0, hashes=[], now=NOW)
    with pytest.raises(CheckpointError, match="incomplete"):
        signer.sign(log_id=HASHES[0], seq=5, hash_=HASHES[4], from_seq=0, hashes=HASHES[1:], now=NOW)


def test_a_missing_trusted_keys_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no trusted checkpoint keys"):
        trusted_keys(tmp_path / "absent.jwks")


def test_a_checkpoint_of_the_widest_cover_verifies_and_a_wider_one_is_refused(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(MAX_COVER + 1)]
    (widest,) = signer.sign(
        log_id=hashes[0], seq=MAX_COVER, hash_=hashes[-2], from_seq=0, hashes=hashes[:-1], now=NOW
    )

    assert len(parse(widest, trusted_keys(tmp_path / "trusted.jwks"), "a:1").anchor.digests) == MAX_COVER
    with pytest.raises(CheckpointError, match="covers 1 to"):
        signer.sign(log_id=hashes[0], seq=MAX_COVER + 1, hash_=hashes[-1], from_seq=0, hashes=hashes, now=NOW)
