"""What the remote programs print, read back: the `@@cvs:` frames.

Line frames are one short fact, `@@cvs:TAG WORDS…`, built on the host only
from checked words. Sections carry command output: raw (the probe's inspect,
every line prefixed `J` for an object's JSON or `E` for a line of stderr) or
encoded (b64, or hex where the host has no base64), so that no output can
forge a frame:

    @@cvs:section inspect.MODE RC raw        @@cvs:section NAME RC ENC
    J {...}                                  <encoded stdout>
    E Error: No such object: ...             @@cvs:stderr
    @@cvs:end inspect.MODE                   <encoded stderr>
                                             @@cvs:end NAME
    @@cvs:done

`@@cvs:done` ends a probe: its absence tells a truncated run from a finished
one. The lock program's frames (`@@cvs:lock`, `@@cvs:holder`, `@@cvs:ready`)
come before the probe's on the same stream (`split_lock_frames`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

FRAME = "@@cvs:"
READY = FRAME + "ready"

# One-line facts the probe prints as `@@cvs:TAG WORDS…`.
LINE_FRAMES = frozenset(
    {"args", "capacity", "facts", "adopted", "record", "listen", "port"}
    # podman hosts: which runtime answered, the other runtime where none did,
    # rootless podman's cgroup facts (remote/runtime.py).
    | {"runtime", "other", "cgroup"}
)


class FrameError(ValueError):
    """Output that is not what the program prints: garbled or forged."""


@dataclass(frozen=True)
class Section:
    name: str
    rc: int
    out: bytes
    err: bytes

    @property
    def stdout(self) -> str:
        return self.out.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", errors="replace")


def _decode(enc: str, lines: list[str]) -> bytes:
    try:
        if enc == "b64":
            raw = base64.b64decode("".join(lines), validate=True)
        elif enc == "hex":
            raw = bytes.fromhex("".join("".join(lines).split()))
        else:
            raise FrameError(f"unknown encoding {enc!r}")
    except (binascii.Error, ValueError) as exc:
        raise FrameError(f"undecodable section body: {exc}") from None
    return raw


def _raw_section(name: str, rc: int, lines: list[str]) -> Section:
    """A raw section: J lines are the objects (as docker's default JSON list),
    E lines stderr; any other line means the output is not ours."""
    objects: list[str] = []
    err: list[str] = []
    for line in lines:
        if line.startswith("J "):
            objects.append(line[2:])
        elif line.startswith("E "):
            err.append(line[2:])
        else:
            raise FrameError(f"unexpected line in section {name!r}: {line[:80]!r}")
    out = ("[" + ",".join(objects) + "]") if objects else ""
    return Section(name, rc, out.encode(), "".join(e + "\n" for e in err).encode())


# The probe's output format (`@@cvs:probe N`, remote/probe.sh): a probe that
# prints another was sent by another cvs, and its frames cannot be trusted.
PROBE_FORMAT = "3"


def _put(sections: dict[str, Section], section: Section) -> None:
    """One section or line frame per name: a repeated one is an error, never
    a silent overwrite of the first."""
    if section.name in sections:
        raise FrameError(f"frame {section.name!r} repeated")
    sections[section.name] = section


def parse_sections(stdout: str) -> tuple[dict[str, Section], bool]:
    """Framed sections and line frames by name, and whether `done` was seen.

    Lines before the first frame (a login banner, a motd) are skipped. A name
    twice, or a probe of another format, is a FrameError."""
    sections: dict[str, Section] = {}
    done = False
    current: tuple[str, int, str] | None = None
    body: list[str] = []
    err: list[str] | None = None
    for line in stdout.splitlines():
        if not line.startswith(FRAME):
            if current is None:
                continue
            if current[2] == "raw":
                body.append(line)
            else:
                (body if err is None else err).append(line.strip())
            continue
        words = line[len(FRAME) :].split()
        if not words:
            raise FrameError(f"bad frame line {line!r}")
        tag = words[0]
        if tag == "section" and current is None and len(words) == 4:
            try:
                current = (words[1], int(words[2]), words[3])
            except ValueError:
                raise FrameError(f"bad frame line {line!r}") from None
            body, err = [], None
        elif tag == "stderr" and current is not None and err is None and current[2] != "raw":
            err = []
        elif (
            tag == "end"
            and current is not None
            and current[2] == "raw"
            and words[1:] == [current[0]]
        ):
            _put(sections, _raw_section(current[0], current[1], body))
            current = None
        elif tag == "end" and current is not None and err is not None and words[1:] == [current[0]]:
            name, rc, enc = current
            _put(sections, Section(name, rc, _decode(enc, body), _decode(enc, err)))
            current = None
        elif tag == "done" and current is None:
            done = True
        elif tag in LINE_FRAMES and current is None:
            rest = line[len(FRAME) + len(tag) :].strip()
            _put(sections, Section(tag, 0, rest.encode(), b""))
        elif tag == "probe" and current is None:
            if words[1:] != [PROBE_FORMAT]:
                raise FrameError(
                    f"probe format {' '.join(words[1:]) or '(none)'}, this cvs reads "
                    f"{PROBE_FORMAT}: another cvs version's probe?"
                )
        else:
            raise FrameError(f"unexpected frame line {line!r}")
    if current is not None:
        raise FrameError(f"section {current[0]!r} not terminated")
    return sections, done


def split_lock_frames(text: str) -> tuple[str | None, list[str], str]:
    """(last lock status word and detail, holder lines, the rest of the output)."""
    status: str | None = None
    holders: list[str] = []
    rest: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith(FRAME + "lock "):
            status = line[len(FRAME + "lock ") :].strip()
        elif line.startswith(FRAME + "holder "):
            holders.append(line[len(FRAME + "holder ") :].strip())
        elif line.strip() == READY:
            continue
        else:
            rest.append(line)
    return status, holders, "".join(rest)
