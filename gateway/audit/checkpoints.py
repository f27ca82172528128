"""Signed checkpoints of the event log, kept in files outside the database (DESIGN §4).

A checkpoint is one compact JWS (Ed25519, `kid` the key's RFC 7638 thumbprint) over canonical JSON:
the log's first hash (which log), the head's seq and hash, the time, and the first 8 bytes of each
event hash since the writer's previous checkpoint, so that verify names the first rewritten seq. Of
a partitioned log, partition "" is signed so (seq 0 while it has no event) and every other partition's
head under `heads`, with the digests of its own events since the previous checkpoint.
Someone who can rewrite the database cannot re-sign them without the private key, which is not in the
database; verify checks the log against them (`store.audit`), knowing nothing of JOSE. A checkpoint
of more partitions than one JWS holds is signed as several lines, its pages (gateway.audit.pages),
and read back as one checkpoint, or refused when a page is missing.

Files: one JWS per line in `<dir>/checkpoints-<YYYY-MM-DD>-<host>.jws`, a checkpoint's lines appended
with one write and an fsync, one file per host so replicas never interleave. Keys: the private key is
an OKP JWK file (0600); trusted public keys are a JWKS file, appended to on rotation and never pruned,
so older checkpoints verify by their kid.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet, OKPKey

from gateway.audit.pages import ONE_LINE, Page, missing, page_of, paginate
from gateway.errors import GatewayError
from gateway.secret_files import create_once, private_dir
from store.canonical import canonical_json
from store.events import GENESIS_HASH, format_ts
from store.model import Anchor, PartitionClaim
from store.ports import AuditLog

ALGORITHM = "Ed25519"  # never "EdDSA": deprecated by RFC 9864, and joserfc warns on it
TYPE = "writ-checkpoint+jws"
VERSION = ONE_LINE
MAX_COVER = 5_000
"""Digests per checkpoint at most (about 54 KB of a line, whatever the partitions: so every head fits
one page), which bounds the hashes read to make one. Seqs before the cover are vouched for by the
head hash alone (found, not named)."""
DIGEST_BYTES = 8


class CheckpointError(GatewayError):
    """A checkpoint cannot be made or read: a missing or malformed key file, an empty log."""


class CheckpointUnverifiable(CheckpointError):
    """A checkpoint line that does not verify: bad signature, unknown key, or a malformed payload."""

    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"checkpoint {source} does not verify: {why}")
        self.source = source
        self.why = why


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A verified checkpoint: what it vouches for, and who signed it when."""

    anchor: Anchor
    kid: str
    at: str
    writer: str
    lines: tuple[str, ...] = ()
    """The signed JWS itself, as appended to the file and sent to the webhook: one line, or each page
    of a checkpoint of several in order."""
    page: Page | None = None
    """Where a line read alone (`parse`) sits in a checkpoint of several; None for a whole one."""


@dataclass(frozen=True, slots=True)
class Cover:
    """A partition's head to sign, and its event hashes of seqs `from_seq`+1 to `seq`."""

    seq: int
    hash: str
    from_seq: int
    hashes: Sequence[str]


def _check_cover(name: str, cover: Cover) -> None:
    where = f"partition {name!r}" if name else "the log"
    if not 0 <= cover.from_seq <= cover.seq or (name and cover.seq < 1):
        raise CheckpointError(
            f"{where}: a head at seq {cover.seq} cannot cover seqs from {cover.from_seq + 1}"
        )
    if len(cover.hashes) != cover.seq - cover.from_seq or (cover.hashes and cover.hashes[-1] != cover.hash):
        raise CheckpointError(
            f"{where}: the event hashes of seqs {cover.from_seq + 1} to {cover.seq} are incomplete"
        )


def _digests(hashes: Sequence[str]) -> str:
    raw = b"".join(bytes.fromhex(h)[:DIGEST_BYTES] for h in hashes)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class CheckpointSigner:
    """Holds the private key; signs checkpoints and rotates the key."""

    def __init__(self, key: OKPKey, key_file: Path, trusted_keys: Path) -> None:
        self._key = key
        self._key_file = key_file
        self._trusted_keys = trusted_keys

    @classmethod
    def load_or_create(cls, key_file: str | Path, trusted_keys: str | Path) -> CheckpointSigner:
        """Load the private key, creating it (0600) on first use; its public half is made trusted.

        Raises:
            CheckpointError: the key file or the trusted keys file is not what Writ wrote.
        """
        key_path, trusted_path = Path(key_file), Path(trusted_keys)
        if not key_path.exists():
            # Or another process's wins; its public key goes into the trusted keys below.
            create_once(key_path, _private_jwk(_generate()), what="checkpoint signing key")
        signer = cls(_read_private(key_path), key_path, trusted_path)
        signer._trust(signer._key)
        return signer

    @property
    def kid(self) -> str:
        return str(self._key.kid)

    def rotate(self) -> CheckpointSigner:
        """A signer with a new key, now in the key file; the old public key stays trusted."""
        key = _generate()
        self._trust(key)  # trusted before it signs anything
        temporary = self._key_file.with_name(f".{self._key_file.name}.new")
        with _exclusive(temporary) as fh:
            fh.write(_private_jwk(key))
        os.replace(temporary, self._key_file)
        return CheckpointSigner(key, self._key_file, self._trusted_keys)

    def sign(
        self,
        *,
        log_id: str,
        seq: int,
        hash_: str,
        from_seq: int,
        hashes: Sequence[str],
        now: datetime,
        heads: Mapping[str, Cover] | None = None,
    ) -> list[str]:
        """The lines of a checkpoint of the log at `seq` of partition ""; `hashes` are its event hashes
        of seqs `from_seq`+1 to `seq` (none: the hashes of its archived events are gone, the head vouches).

        `heads`: every other partition's head and event hashes (a partitioned log), signed with it; with
        them, `seq` may be 0 (partition "" has no event yet: then `log_id` is the genesis hash). One line
        while it fits (`pages.PAGE_BYTES`), else its pages, each line signed alone.

        Raises:
            CheckpointError: the log is empty, the hashes are more than `MAX_COVER`, or some do not cover
                their range.
        """
        covers = dict(heads or {})
        if seq < 1 and not covers:
            raise CheckpointError("the log is empty: there is nothing to checkpoint yet")
        if seq < 1:
            log_id, hash_, from_seq, hashes = GENESIS_HASH, GENESIS_HASH, 0, ()
        if not 0 <= from_seq <= seq or seq - from_seq > MAX_COVER:
            raise CheckpointError(f"a checkpoint covers 1 to {MAX_COVER} seqs, not {from_seq + 1} to {seq}")
        _check_cover("", Cover(seq, hash_, from_seq, hashes))
        for name, cover in covers.items():
            _check_cover(name, cover)
        if (seq - from_seq) + sum(c.seq - c.from_seq for c in covers.values()) > MAX_COVER:
            raise CheckpointError(f"a checkpoint carries at most {MAX_COVER} event hashes")
        payload = {
            "v": VERSION,
            "log": log_id,
            "seq": seq,
            "hash": hash_,
            "events": seq,
            "at": format_ts(now),
            "from_seq": from_seq,
            "digests": _digests(hashes),
            "writer": f"{socket.gethostname()}:{os.getpid()}",
        }
        if covers:  # absent for a log of one partition: such a checkpoint reads as before partitions
            payload["heads"] = {
                name: [c.seq, c.hash, c.from_seq, _digests(c.hashes)] for name, c in sorted(covers.items())
            }
        header = {"alg": ALGORITHM, "kid": self.kid, "typ": TYPE}
        return [
            jws.serialize_compact(
                header, canonical_json(page).encode("utf-8"), self._key, algorithms=[ALGORITHM]
            )
            for page in paginate(payload)
        ]

    def _trust(self, key: OKPKey) -> None:
        keys = trusted_key_dicts(self._trusted_keys) if self._trusted_keys.exists() else []
        if any(k.get("kid") == key.kid for k in keys):
            return
        public = key.as_dict(private=False) | {"alg": ALGORITHM, "use": "sig"}
        private_dir(self._trusted_keys.parent)
        temporary = self._trusted_keys.with_name(f".{self._trusted_keys.name}.new")
        with _exclusive(temporary, mode=0o644) as fh:
            fh.write(json.dumps({"keys": [*keys, public]}, indent=2) + "\n")
        os.replace(temporary, self._trusted_keys)


def trusted_key_dicts(path: Path) -> list[dict[str, Any]]:
    """The JWKs of the trusted keys file.

    Raises:
        CheckpointError: the file is missing or is not a JWKS.
    """
    try:
        document = json.loads(path.read_text())
        keys: list[dict[str, Any]] = document["keys"]
        if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
            raise TypeError
    except FileNotFoundError:
        raise CheckpointError(f"no trusted checkpoint keys at {path}") from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path} is not a JWKS ({{'keys': [...]}})") from None
    return keys


def trusted_keys(path: str | Path) -> KeySet:
    """The trusted public keys, every one an Ed25519 key with a kid.

    Raises:
        CheckpointError: the file is missing, is not a JWKS, or holds another kind of key.
    """
    keys: list[Key] = []
    for jwk in trusted_key_dicts(Path(path)):
        try:
            key = OKPKey.import_key(jwk)
        except (JoseError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: a key is not an Ed25519 JWK: {exc}") from None
        if jwk.get("crv") != "Ed25519" or not jwk.get("kid"):
            raise CheckpointError(f"{path}: every key must be an Ed25519 JWK with a kid")
        keys.append(key)
    return KeySet(keys)


def parse(line: str, keys: KeySet, source: str) -> Checkpoint:
    """Verify one checkpoint line against the trusted keys and read what it vouches for.

    Raises:
        CheckpointUnverifiable: the signature, key id, header or payload is not right.
    """
    try:
        header = json.loads(_b64decode(line.split(".", 1)[0]))
        kid = header["kid"] if isinstance(header, dict) else None
        if not isinstance(kid, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise CheckpointUnverifiable(source, "not a compact JWS with a kid") from None
    if header.get("alg") != ALGORITHM or header.get("typ") != TYPE:
        raise CheckpointUnverifiable(source, f"the header must be alg {ALGORITHM}, typ {TYPE}")
    try:
        verified = jws.deserialize_compact(line, keys, algorithms=[ALGORITHM])
    except JoseError as exc:
        raise CheckpointUnverifiable(source, f"kid {kid}: {type(exc).__name__}: {exc}") from None
    try:
        payload = json.loads(verified.payload)
        return replace(_checkpoint(payload, kid, source), lines=(line,))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise CheckpointUnverifiable(source, f"signed, but the payload is malformed: {exc}") from None


def append(directory: str | Path, lines: str | Sequence[str], now: datetime) -> Path:
    """Append one checkpoint (its line, or all its pages' lines) to this host's file of the day, with
    one write and an fsync.

    Raises:
        OSError: the directory cannot be made or the file written.
    """
    path = Path(directory) / f"checkpoints-{now.strftime('%Y-%m-%d')}-{socket.gethostname()}.jws"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{line}\n" for line in ([lines] if isinstance(lines, str) else lines))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_all(paths: Iterable[str | Path], keys: KeySet) -> list[Checkpoint]:
    """Every checkpoint in the given files and directories (`*.jws`), each verified, duplicates dropped,
    the pages of each checkpoint of several lines read as one.

    Raises:
        CheckpointUnverifiable: a line does not verify, or a checkpoint lacks a page; it names file and
            line, and is never skipped.
        CheckpointError: a path does not exist.
    """
    found: dict[str, tuple[Checkpoint, str]] = {}
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = sorted(path.glob("*.jws"))
        elif path.is_file():
            files = [path]
        else:
            raise CheckpointError(f"no checkpoints at {path}: no such file or directory")
        for file in files:
            for number, text in enumerate(file.read_text().splitlines(), start=1):
                line = text.strip()
                if line and line not in found:
                    found[line] = (parse(line, keys, f"{file}:{number}"), f"{file}:{number}")
    whole = [checkpoint for checkpoint, _ in found.values() if checkpoint.page is None]
    sets: dict[str, list[tuple[Checkpoint, str]]] = {}
    for checkpoint, where in found.values():
        if checkpoint.page is not None:
            sets.setdefault(checkpoint.page.set, []).append((checkpoint, where))
    whole.extend(assemble(pages) for pages in sets.values())
    return sorted(whole, key=lambda c: (c.anchor.seq, c.at))


def assemble(pages: Sequence[tuple[Checkpoint, str]]) -> Checkpoint:
    """One checkpoint of the lines of its pages (each parsed alone, with where it was read; at least
    one, and lines of whole checkpoints are not pages and are left out).

    Raises:
        CheckpointUnverifiable: a page is missing, or the pages are not of one checkpoint.
    """
    placed = sorted(
        ((checkpoint.page, checkpoint, where) for checkpoint, where in pages if checkpoint.page is not None),
        key=lambda found: found[0].number,
    )
    page, first, where = placed[0]
    ordered = [(checkpoint, at) for _, checkpoint, at in placed]
    made = f"made {first.at} by {first.writer}, set {page.set}"
    try:
        lacking = missing([placed_page for placed_page, _, _ in placed])
    except ValueError as exc:
        raise CheckpointUnverifiable(where, f"a page of a checkpoint of several ({made}): {exc}") from None
    if lacking:
        raise CheckpointUnverifiable(
            where,
            f"page {page.number} of {page.of} of one checkpoint ({made}); "
            f"page{'s' if len(lacking) > 1 else ''} {', '.join(map(str, lacking))} missing: the heads of "
            "the partitions there would be vouched for by older checkpoints alone",
        )
    heads: list[PartitionClaim] = []
    for checkpoint, at in ordered:
        anchor = checkpoint.anchor
        if (anchor.log_id, checkpoint.at, checkpoint.writer, checkpoint.kid) != (
            first.anchor.log_id,
            first.at,
            first.writer,
            first.kid,
        ):
            raise CheckpointUnverifiable(at, f"a page of another log, moment, writer or key than {where}")
        heads.extend(anchor.heads)
    if len({claim.partition for claim in heads}) != len(heads):
        raise CheckpointUnverifiable(where, f"two pages of one checkpoint ({made}) sign one partition")
    source = f"{_lines_of([at for _, at in ordered])} (kid {first.kid}, made {first.at})"
    anchor = replace(first.anchor, heads=tuple(sorted(heads, key=lambda c: c.partition)), source=source)
    lines = tuple(line for checkpoint, _ in ordered for line in checkpoint.lines)
    return replace(first, anchor=anchor, lines=lines, page=None)


def _lines_of(places: Sequence[str]) -> str:
    """`FILE:3-5` for pages read from lines 3 to 5 of one file, else every place."""
    if len(set(places)) == 1:
        return places[0]  # just written: the file alone
    files = {place.rsplit(":", 1)[0] for place in places}
    if len(files) == 1:
        numbers = [place.rsplit(":", 1)[1] for place in places]
        return f"{files.pop()}:{numbers[0]}-{numbers[-1]}"
    return ", ".join(places)


def _checkpoint(payload: dict[str, Any], kid: str, source: str) -> Checkpoint:
    page = page_of(payload)
    if page is not None and page.number > 1:  # partition "" is on page 1
        payload = payload | {"seq": 0, "hash": GENESIS_HASH, "from_seq": 0, "digests": ""}
    seq, from_seq, log_id, hash_ = payload["seq"], payload["from_seq"], payload["log"], payload["hash"]
    signed_heads = payload.get("heads", {})
    if not isinstance(signed_heads, dict):
        raise ValueError("heads must map each partition to its [seq, hash, from_seq, digests]")
    if not (isinstance(seq, int) and isinstance(from_seq, int) and 0 <= from_seq <= seq):
        raise ValueError("seq and from_seq must be integers with 0 <= from_seq <= seq")
    if seq == 0 and not signed_heads:
        raise ValueError("seq must be at least 1 in a checkpoint of one partition")
    if not (isinstance(log_id, str) and isinstance(hash_, str)):
        raise ValueError("log and hash must be strings")
    digests = _read_digests(payload["digests"], from_seq, seq)
    at = str(payload["at"])
    heads = tuple(_head(str(name), given) for name, given in sorted(signed_heads.items()))
    source = f"{source} (kid {kid}, made {at})"
    anchor = Anchor(log_id, seq, hash_, from_seq, digests, source=source, heads=heads)
    return Checkpoint(anchor, kid, at, str(payload["writer"]), page=page)


def _read_digests(text: Any, from_seq: int, seq: int) -> tuple[str, ...]:
    raw = _b64decode(text)
    if len(raw) != (seq - from_seq) * DIGEST_BYTES:
        raise ValueError(f"digests must cover seqs {from_seq + 1} to {seq}")
    return tuple(raw[i : i + DIGEST_BYTES].hex() for i in range(0, len(raw), DIGEST_BYTES))


def _head(name: str, given: Any) -> PartitionClaim:
    # [seq, hash] from a Writ that signed other partitions' heads alone; [seq, hash, from_seq, digests].
    if not (
        isinstance(given, list)
        and len(given) in (2, 4)
        and isinstance(given[0], int)
        and given[0] >= 1
        and isinstance(given[1], str)
    ):
        raise ValueError("each partition's head must be [seq, hash, from_seq, digests] with seq >= 1")
    seq, hash_ = given[0], given[1]
    if len(given) == 2:
        return PartitionClaim(name, seq, hash_, seq)
    from_seq = given[2]
    if not (isinstance(from_seq, int) and 0 <= from_seq <= seq):
        raise ValueError(f"partition {name!r}: from_seq must be an integer from 0 to its seq")
    return PartitionClaim(name, seq, hash_, from_seq, _read_digests(given[3], from_seq, seq))


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _generate() -> OKPKey:
    return OKPKey.generate_key("Ed25519", auto_kid=True)


def _private_jwk(key: OKPKey) -> str:
    return json.dumps(key.as_dict(private=True))


def _read_private(path: Path) -> OKPKey:
    try:
        jwk = json.loads(path.read_text())
        key = OKPKey.import_key(jwk)
    except (ValueError, TypeError, JoseError) as exc:
        raise CheckpointError(f"{path} is not an Ed25519 private JWK: {exc}") from None
    if jwk.get("crv") != "Ed25519" or "d" not in jwk or not key.kid:
        raise CheckpointError(f"{path} is not an Ed25519 private JWK with a kid")
    return key


class _exclusive:
    """A new file opened for writing (mode 0600 unless told), fsynced on close."""

    def __init__(self, path: Path, mode: int = 0o600) -> None:
        self._path, self._mode = path, mode

    def __enter__(self) -> Any:
        if self._path.exists():
            self._path.unlink()  # a leftover of a crashed rotation
        self._fh = os.fdopen(os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self._mode), "w")
        return self._fh

    def __exit__(self, *exc: object) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


def write_checkpoint(
    log: AuditLog,
    signer: CheckpointSigner,
    directory: str | Path,
    keys: KeySet,
    now: datetime,
    previous: Mapping[str, int] | None = None,
) -> tuple[Checkpoint, Path]:
    """Sign every partition's head and append it to this host's file in `directory`: one line, or as
    many pages as it takes (gateway.audit.pages), in one write.

    The digests of each partition cover its events since `previous` (its seq there; default: the
    newest a checkpoint already in `directory` for this log vouches for), at most `MAX_COVER` in all,
    partition "" first, so every event gets a digest of its own.

    Raises:
        CheckpointError: the log is empty, a checkpoint already there does not verify, or the first
            event of partition "" was archived and no checkpoint in `directory` names the log.
        OSError: the directory cannot be written.
    """
    heads = log.partition_heads()
    seq, head_hash = heads.get("", (0, GENESIS_HASH))
    others = {name: head for name, head in heads.items() if name and head[0] > 0}
    if seq < 1 and not others:
        raise CheckpointError("the log is empty: there is nothing to checkpoint yet")
    found: list[Checkpoint] | None = None

    def checkpoints() -> list[Checkpoint]:
        nonlocal found
        if found is None:
            found = read_all([directory], keys) if Path(directory).is_dir() else []
        return found

    log_id = log_identity(log, seq, checkpoints)
    if previous is None:
        previous = newest_heads(checkpoints(), log_id)
    room = MAX_COVER
    from_seq, hashes = 0, list[str]()
    if seq:
        from_seq, hashes = _cover(log, "", max(min(previous.get("", 0), seq - 1), seq - room, 0), seq)
        room -= seq - from_seq
    covers: dict[str, Cover] = {}
    for name, (at, last_hash) in sorted(others.items()):
        start, taken = _cover(log, name, max(min(previous.get(name, 0), at), at - room, 0), at)
        covers[name] = Cover(at, last_hash, start, taken)
        room -= at - start
    lines = signer.sign(
        log_id=log_id, seq=seq, hash_=head_hash, from_seq=from_seq, hashes=hashes, now=now, heads=covers
    )
    path = append(directory, lines, now)
    if len(lines) == 1:
        return parse(lines[0], keys, f"{path}"), path
    return assemble([(parse(line, keys, f"{path}"), f"{path}") for line in lines]), path


def _cover(log: AuditLog, partition: str, from_seq: int, seq: int) -> tuple[int, list[str]]:
    """The hashes of `partition` from `from_seq`+1 to `seq`, and the seq they start after: those of
    events archived since are gone, and the head vouches for them."""
    hashes = log.event_hashes(from_seq, seq, partition)
    return seq - len(hashes), hashes


def log_identity(log: AuditLog, seq: int, checkpoints: Callable[[], list[Checkpoint]]) -> str:
    """The hash of the first event of partition "" (which ends at `seq`), naming the log: the genesis
    hash while it has none; once it was archived, as the newest of `checkpoints` that vouches for
    partition "" names it.

    Raises:
        CheckpointError: the first event was archived and no checkpoint names the log.
    """
    if seq < 1:
        return GENESIS_HASH
    first = log.event_hashes(0, 1)
    if first:
        return first[0]
    named = [c for c in checkpoints() if c.anchor.seq >= 1]
    if not named:
        raise CheckpointError(
            "the log's first event was archived and no checkpoint here names the log: give the "
            "directory of its checkpoints"
        )
    return max(named, key=lambda c: (c.anchor.seq, c.at)).anchor.log_id


def newest_heads(checkpoints: Iterable[Checkpoint], log_id: str) -> dict[str, int]:
    """The newest seq any of `checkpoints` of the log `log_id` vouches for in each partition (those
    made while partition "" was empty name no log, and count too)."""
    newest: dict[str, int] = {}
    for checkpoint in checkpoints:
        if checkpoint.anchor.log_id not in (log_id, GENESIS_HASH):
            continue
        for claim in checkpoint.anchor.claims():
            newest[claim.partition] = max(newest.get(claim.partition, 0), claim.seq)
    return newest
